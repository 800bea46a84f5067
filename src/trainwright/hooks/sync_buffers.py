"""SyncBuffersHook (mmengine's): the model's floating buffers (BatchNorm statistics) averaged over the processes, per
epoch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from trainwright.dist.shards import is_sharded
from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register_module()
class SyncBuffersHook(Hook):
    """Average every floating buffer of the model (BatchNorm's running mean and variance) over the processes.

    As mmengine's: after each training epoch, and before a validation that no epoch's end
    synchronised (an iteration-based run). Each process otherwise keeps the statistics of its
    own shard of the data: under FSDP, whose buffers are never synchronised, and under DDP
    with ``broadcast_buffers=False`` (mmengine's default wrapper). One all-reduce of all the
    buffers at once; integer buffers (``num_batches_tracked``, equal on every rank) and
    sharded ones are left as they are. On one process it does nothing.
    """

    priority = "NORMAL"

    def __init__(self) -> None:
        self._synced = False  # by the last epoch's end: the validation right after it needs no second all-reduce

    @override
    def after_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        average_buffers(trainer)
        self._synced = True

    @override
    def before_val_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        if not self._synced:
            average_buffers(trainer)
        self._synced = False


def average_buffers(trainer: TrainerView) -> None:
    """Average the model's floating, unsharded buffers over the processes in one all-reduce (nothing on one process)."""
    if trainer.strategy.world_size == 1:
        return
    buffers = [b for b in trainer.unwrapped_model.buffers() if b.is_floating_point() and not is_sharded(b)]
    if not buffers:
        return
    mean = trainer.strategy.reduce(torch.cat([b.detach().reshape(-1).float() for b in buffers]), "mean")
    with torch.no_grad():
        for b, part in zip(buffers, mean.split([b.numel() for b in buffers])):
            b.copy_(part.view_as(b))
