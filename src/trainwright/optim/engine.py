"""UpdateEngine: how an optim wrapper's update is carried out (backward, clipping, step, gradient sync).

The optim wrapper decides *when* (accumulation windows, clipping config); the engine decides
*how*. This class is the one-process engine every wrapper starts with; every
:class:`~trainwright.strategies.Strategy` is one, and a distributed strategy overrides the
methods whose behaviour differs (Lightning Fabric's ``Strategy.backward`` /
``optimizer_step``). Capabilities (:meth:`no_sync_context`, :meth:`adapt_precision`) are
asked once, when a wrapper is given the engine; the other methods run every update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainwright.amp.precision import Precision
from trainwright.dist.utils import all_reduce, get_world_size
from trainwright.optim.counted_loss import item_factor

if TYPE_CHECKING:
    from trainwright.optim.optim_wrapper import OptimWrapper

#: ``model -> context manager`` that suppresses gradient synchronisation (DDP's ``no_sync``).
NoSyncContext = Callable[[nn.Module], contextlib.AbstractContextManager]
#: ``parameters -> total gradient norm``: the clip function with the ``clip_grad`` arguments bound.
ClipFn = Callable[[list[torch.Tensor]], torch.Tensor]


class UpdateEngine:
    """Backward, clipping, optimizer step and gradient sync on one process (the default of every optim wrapper)."""

    def backward(self, loss: torch.Tensor, optim_wrapper: OptimWrapper, **kwargs: Any) -> None:
        """Back-propagate ``loss`` through the wrapper's precision (a GradScaler scales it first)."""
        optim_wrapper.precision.backward(loss, **kwargs)

    def skip_nonfinite(self, loss: torch.Tensor, optim_wrapper: OptimWrapper) -> bool:
        """Whether to skip the micro-batch of ``loss`` (``skip_nonfinite``): it is NaN/Inf (several processes: on any
        of them, agreed)."""
        return not bool(torch.isfinite(loss).all())

    def sync_gradients(self, optim_wrapper: OptimWrapper) -> None:
        """Make the gradients of ``optim_wrapper``'s parameters the same on every process, before its update (unscaling,
        clipping, step).

        Nothing here, nor under a strategy whose backward synchronises them (DDP's reducer, FSDP,
        DeepSpeed). The DDP strategy averages them here when the model's training forward does
        not run through its DDP wrapper (an overridden ``train_step``).
        """

    def clip_grad(self, clip: ClipFn, params: list[torch.Tensor]) -> torch.Tensor | None:
        """Clip ``params``' gradients with ``clip`` and return their total norm (a tensor; None: not known here)."""
        return clip(params)

    def optimizer_step(self, optim_wrapper: OptimWrapper, **kwargs: Any) -> None:
        """Step the wrapper's optimizer through its precision (float16: skipped on inf/NaN gradients)."""
        optim_wrapper.precision.optimizer_step(optim_wrapper.optimizer, **kwargs)

    def item_scale(self, items: torch.Tensor) -> torch.Tensor:
        """The factor that turns a window's gradients of summed losses into the gradient of their per-item mean.

        ``items`` is this process's count of the window (see :mod:`trainwright.optim.counted_loss`);
        here ``1 / items``. A strategy whose gradient sync averages over processes sums the
        count over them (one tensor collective, no host sync) and multiplies by how many it
        averaged over. Called once per update, on the updating micro-batch.
        """
        return item_factor(items, 1)

    def no_sync_context(self) -> NoSyncContext | None:
        """A ``model -> context`` that suppresses gradient sync inside accumulation windows; None: nothing to
        suppress."""
        return None

    def adapt_precision(self, precision: Precision) -> Precision:
        """The precision a wrapper uses under this engine (e.g. with a sharded GradScaler); here ``precision``
        itself."""
        return precision


def _own_no_sync(model: nn.Module) -> contextlib.AbstractContextManager:
    """``no_sync()`` of the module that runs ``model``'s training forward (its DDP wrapper, or itself), if it has
    one."""
    runner = getattr(model, "forward_caller", None) or model
    no_sync = getattr(runner, "no_sync", None)
    return no_sync() if callable(no_sync) else contextlib.nullcontext()


class LocalEngine(UpdateEngine):
    """The engine of a wrapper used in the user's own loop: a DDP model's own ``no_sync`` inside windows, as
    mmengine's ``optim_context``."""

    def no_sync_context(self) -> NoSyncContext | None:  # noqa: D102
        return _own_no_sync

    def item_scale(self, items: torch.Tensor) -> torch.Tensor:
        """Under ``torch.distributed``, the count summed over every process, for a DDP model's averaged gradients
        (else ``1 / items``)."""
        world = get_world_size()
        if world == 1:
            return item_factor(items, 1)
        return item_factor(all_reduce(items.detach().to(torch.float32).clone(), "sum"), world)


#: The engine of an optim wrapper that no strategy has been given (the user's own loop).
LOCAL = LocalEngine()
