"""IterTimerHook: data_time, iter_time and the ETA."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer


@HOOKS.register
class IterTimerHook(Hook):
    """Records ``data_time`` (waiting for the batch) and ``time`` (the whole iteration).

    Both are plain ``time.perf_counter`` differences: no device synchronisation, so on
    accelerators ``time`` measures the host's view (it converges to the device's pace
    because the queue of launched work is bounded).
    """

    priority = "VERY_HIGH"

    def __init__(self) -> None:
        self._t = 0.0

    def before_train_epoch(self, trainer: Trainer) -> None:  # noqa: D102
        self._t = time.perf_counter()

    def before_train_iter(self, trainer: Trainer, batch_idx: int, data_batch: Any = None) -> None:  # noqa: D102
        trainer.metric_store.update_scalar("data_time", time.perf_counter() - self._t)

    def after_train_iter(self, trainer: Trainer, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        now = time.perf_counter()
        trainer.metric_store.update_scalar("time", now - self._t)
        self._t = now

    def before_val_epoch(self, trainer: Trainer) -> None:  # noqa: D102
        self._v = time.perf_counter()

    def after_val_epoch(self, trainer: Trainer, metrics: dict | None = None) -> None:  # noqa: D102
        trainer.metric_store.update_scalar("val_time", time.perf_counter() - self._v)
        self._t = time.perf_counter()  # validation time does not count as training data time
