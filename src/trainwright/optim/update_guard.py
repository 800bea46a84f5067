"""Update guards: what an optim wrapper asks, in order, before it back-propagates a micro-batch.

:meth:`OptimWrapper.update_params <trainwright.optim.optim_wrapper.OptimWrapper.update_params>` asks each guard of
its public :attr:`~trainwright.optim.optim_wrapper.OptimWrapper.update_guards` list, first to last, whether to skip
the micro-batch of a loss; the first that says yes decides (:class:`UpdateGuard`). Two guards ship with trainwright:
:class:`NonFiniteGuard` (``skip_nonfinite``) and the loss-spike guard
(:class:`~trainwright.optim.spike_guard.SpikeGuard`). A guard of your own is any object with ``check(loss) -> bool``
and ``skips_window``, appended to the list.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from trainwright.optim.optim_wrapper import OptimWrapper

__all__ = ["NonFiniteGuard", "UpdateGuard"]


@runtime_checkable
class UpdateGuard(Protocol):
    """Decides, before a micro-batch is back-propagated, whether its update is skipped.

    A skipped micro-batch is counted (the accumulation window goes on) but not back-propagated; a guard whose
    :attr:`skips_window` is True also leaves its whole window unstepped.

    Attributes:
        skips_window: True: a skipped micro-batch also leaves its accumulation window unstepped
            (the gradients other micro-batches of the window accumulated are dropped at its end);
            False: only this micro-batch's backward is left out, the window is stepped as usual.
    """

    skips_window: bool

    def check(self, loss: torch.Tensor) -> bool:
        """Whether to skip the micro-batch of ``loss`` (its mean; per item when ``update_params`` got ``num_items``).

        Under several processes the answer must be the same on every rank (agree on it through
        a collective), or the ranks' gradient all-reduces stop pairing up.
        """
        ...


class NonFiniteGuard:
    """Skips the backward of a micro-batch whose loss is NaN / Inf (``skip_nonfinite=True``); the window is stepped as
    usual.

    Asks the wrapper's update engine (its strategy), so under several processes every rank
    skips when any rank's loss is non-finite. Costs one host read per micro-batch.

    Args:
        optim_wrapper: The wrapper it guards (its ``strategy`` agrees on the decision).

    Attributes:
        skipped: Micro-batches skipped so far (the wrapper's ``skipped_steps``).
    """

    skips_window = False

    def __init__(self, optim_wrapper: OptimWrapper) -> None:
        self.optim_wrapper = optim_wrapper
        self.skipped = 0

    def check(self, loss: torch.Tensor) -> bool:
        """Whether ``loss`` is NaN / Inf (several processes: on any rank); a skip is counted and warned about."""
        ow = self.optim_wrapper
        if not ow.strategy.skip_nonfinite(loss, ow):
            return False
        self.skipped += 1
        warnings.warn(
            f"Skipping a micro-batch with non-finite loss (here {loss.detach()}; under several processes: on any of "
            "them) (skip_nonfinite=True)",
            RuntimeWarning,
            stacklevel=4,  # the caller of update_params
        )
        return True

    def __repr__(self) -> str:
        return f"NonFiniteGuard(skipped={self.skipped})"
