"""Losses that carry their count: a summed loss normalised over its whole accumulation window and all ranks.

A token-level loss (masked language modelling, instruction tuning with the prompt masked by ``-100``) averaged per
micro-batch weights every micro-batch equally, however many tokens it holds, so an accumulated update differs from one
step on the concatenated batch. A model that reports its loss as a **sum with its number of items** (``num_items`` in
its dict of losses; docs/optim.md shows one) lets the optim wrapper divide by the items of the whole window instead
(:class:`WindowItems`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainwright.optim.engine import UpdateEngine

#: The key of a loss dict that holds the number of items its ``loss`` entries are summed over.
NUM_ITEMS = "num_items"

#: What a count may be: a tensor with one element, or a Python number.
Count = torch.Tensor | int | float


def num_items_of(losses: Any) -> Count | None:
    """The ``num_items`` entry of a dict of losses (None: the losses are means, today's contract).

    Args:
        losses: What the model's forward returned in ``"loss"`` mode.

    Returns:
        The count, as given (a tensor stays on its device: nothing is read on the host).

    Raises:
        TypeError: ``num_items`` is not a number or a one-element tensor, or a loss entry is
            not a scalar tensor (with a count, every ``loss`` entry must be the sum over those items).
    """
    if not isinstance(losses, Mapping) or NUM_ITEMS not in losses:
        return None
    n = losses[NUM_ITEMS]
    if isinstance(n, bool) or not (isinstance(n, (int, float)) or (isinstance(n, torch.Tensor) and n.numel() == 1)):
        raise TypeError(
            f"The loss dict's {NUM_ITEMS!r} must be the number of items its losses are summed over (a number or a "
            "one-element "
            f"tensor, e.g. (labels != -100).sum()), got {type(n).__name__}"
            + (f" of shape {tuple(n.shape)}" if isinstance(n, torch.Tensor) else "")
        )
    bad = [k for k, v in losses.items() if "loss" in k and not (isinstance(v, torch.Tensor) and v.dim() == 0)]
    if bad:
        raise TypeError(
            f"The loss dict holds {NUM_ITEMS!r}, so each loss entry must be one number, the sum over those items; "
            f"{bad} are not "
            "scalar tensors. Sum them (e.g. F.cross_entropy(..., reduction='sum')), or drop num_items to return "
            "per-batch means."
        )
    return n


def per_item(value: torch.Tensor, num_items: Count) -> torch.Tensor:
    """``value / num_items`` for logging (a micro-batch without items logs 0, not NaN)."""
    n = torch.as_tensor(num_items, device=value.device)
    return value.detach() / torch.where(n > 0, n, torch.ones_like(n))


class WindowItems:
    """The items of the summed losses back-propagated in the current accumulation window.

    Kept by an :class:`~trainwright.optim.optim_wrapper.OptimWrapper`: :meth:`add` for every
    counted micro-batch back-propagated, :meth:`add_mean` for every mean one (a window may not
    mix them), :meth:`normalise` on the updating micro-batch, :meth:`reset` when the gradients
    are zeroed.

    The wrapper back-propagates the sums as they are and, on the updating micro-batch, multiplies the accumulated
    gradients by ``1 / (items of the window over every rank)`` before clipping and stepping: one tensor operation per
    update, no look-ahead over the window's batches, no host synchronisation (the count is summed over ranks by one
    tensor collective of the strategy, :meth:`~trainwright.optim.engine.UpdateEngine.item_scale`). The result equals
    one step on the concatenated batch of the window (and of every rank), up to float rounding.

    Attributes:
        total: The items of the window so far on this rank (a tensor on the loss's device), or
            None when no counted loss was back-propagated in it.
    """

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self._means = False  # a mean loss was back-propagated in this window

    def add(self, num_items: Count, loss: torch.Tensor) -> None:
        """Count the items of a summed loss just back-propagated (a tensor addition; nothing read on the host)."""
        if self._means:
            raise ValueError(_MIXED)
        n = (
            num_items.detach()
            if isinstance(num_items, torch.Tensor)
            else torch.as_tensor(num_items, device=loss.device)
        )
        n = n.reshape(())
        self.total = n if self.total is None else self.total + n

    def add_mean(self) -> None:
        """Note a mean loss back-propagated in this window (one with a count may not follow it)."""
        if self.total is not None:
            raise ValueError(_MIXED)
        self._means = True

    def normalise(self, params: list[torch.Tensor], engine: UpdateEngine) -> None:
        """Divide the window's gradients by its items over every rank (nothing to do for mean losses)."""
        if self.total is None:
            return
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            factor = engine.item_scale(self.total)
            torch._foreach_mul_(grads, factor.to(grads[0].device))

    def reset(self) -> None:
        """Start a new window (the gradients were zeroed)."""
        self.total = None
        self._means = False

    def state_dict(self) -> dict[str, Any]:
        """``{"partial_items": count}`` for an unfinished window with a count (an optim wrapper's state holds it),
        else empty."""
        return {} if self.total is None else {"partial_items": self.total.detach().clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the count of :meth:`state_dict` (none when ``state`` has no ``partial_items``)."""
        items = state.get("partial_items")
        self.total = None if items is None else torch.as_tensor(items).clone()
        self._means = False


_MIXED = (
    f"One accumulation window mixes losses with and without {NUM_ITEMS!r}: the summed ones are divided by the items of "
    "the "
    f"window and the mean ones by the window's size, so their sum means nothing. Return {NUM_ITEMS!r} from every "
    "training "
    "forward (0 for a batch without items), or from none."
)


def item_factor(total: torch.Tensor, averaged_over: int) -> torch.Tensor:
    """``averaged_over / total`` as float32 (0 when ``total`` is 0: the gradients of an empty window are 0 anyway).

    ``averaged_over`` is the number of processes the gradient sync averaged over (DDP and
    FSDP divide the summed gradients by it), so the result turns averaged gradients of summed
    losses into the gradient of the per-item mean of every rank's items.
    """
    total = total.to(torch.float32)
    return torch.where(
        total > 0, averaged_over / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(total)
    )
