"""EmptyCacheHook (mmengine's): give the CUDA caching allocator's unused blocks back to the driver at epoch or
iteration ends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register_module()
class EmptyCacheHook(Hook):
    """``torch.cuda.empty_cache()`` before / after each epoch (training, validation, test) or after each iteration, as
    mmengine's.

    It frees nothing a tensor uses, and costs a synchronisation: ``after_iter=True`` slows every
    step (kept for parity; it is rarely worth it). Without CUDA it does nothing.

    Args:
        before_epoch: Before each epoch (default False).
        after_epoch: After each epoch (default True).
        after_iter: After each iteration (default False).
    """

    priority = "NORMAL"

    def __init__(self, before_epoch: bool = False, after_epoch: bool = True, after_iter: bool = False) -> None:
        self.before_epoch, self.after_epoch, self.after_iter = before_epoch, after_epoch, after_iter

    @override
    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        return 1 if self.after_iter else 0  # no call per training iteration unless asked

    @staticmethod
    def _empty() -> None:
        if torch.cuda.is_initialized():  # CUDA in use in this process (else there is no cache to empty)
            torch.cuda.empty_cache()

    def _before_epoch(self, trainer: TrainerView) -> None:
        if self.before_epoch:
            self._empty()

    def _after_epoch(self, trainer: TrainerView, metrics: Any = None) -> None:
        if self.after_epoch:
            self._empty()

    # the same for training, validation and test epochs
    before_train_epoch = before_val_epoch = before_test_epoch = _before_epoch
    after_train_epoch = after_val_epoch = after_test_epoch = _after_epoch

    @override
    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:  # noqa: D102
        if self.after_iter:
            self._empty()
