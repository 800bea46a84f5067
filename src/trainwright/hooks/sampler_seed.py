"""DistSamplerSeedHook: a new data order every epoch, reproducible from (seed, epoch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register
class DistSamplerSeedHook(Hook):
    """Calls ``set_epoch(epoch)`` on the train loader before each epoch (mmengine name)."""

    def before_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        loop = trainer.train_loop
        if loop is not None and loop.by_epoch:
            loader = loop.dataloader
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(trainer.progress.epoch)
