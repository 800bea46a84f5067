"""ParamSchedulerHook: steps the learning-rate / momentum schedulers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


def _flatten(schedulers: Any) -> list[Any]:
    if not schedulers:
        return []
    if isinstance(schedulers, dict):
        return [s for v in schedulers.values() for s in _flatten(v)]
    if isinstance(schedulers, (list, tuple)):
        return list(schedulers)
    return [schedulers]


@HOOKS.register
class ParamSchedulerHook(Hook):
    """Steps iteration-based schedulers after every iteration, epoch-based after every epoch."""

    priority = "LOW"

    def __init__(self) -> None:
        self._iter: list[Any] = []
        self._epoch: list[Any] = []

    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        all_s = _flatten(trainer.param_schedulers)
        self._iter = [s for s in all_s if not s.by_epoch]
        self._epoch = [s for s in all_s if s.by_epoch]

    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        return 1 if self._iter else 0  # only iteration-based schedulers step per iteration

    def after_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        for s in self._iter:
            s.step()

    def after_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        for s in self._epoch:
            s.step()
