"""IterTimerHook: data_time, iter_time and the ETA."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView

_clock = time.perf_counter


@HOOKS.register
class IterTimerHook(Hook):
    """Turns on ``data_time`` (waiting for the batch) and ``time`` (the whole iteration), and logs ``val_time``.

    Both are plain ``time.perf_counter`` differences: no device synchronisation, so on
    accelerators ``time`` measures the host's view (it converges to the device's pace
    because the queue of launched work is bounded). Nothing runs per iteration here: the
    train loop gives the metric store two timestamps with each iteration's outputs, and the
    store derives both times when it flushes. This hook starts the store's clock at each
    epoch start and again after validation (so neither counts as waiting for data);
    without it (``default_hooks=dict(timer=None)``) no times are logged.
    """

    priority = "VERY_HIGH"

    def __init__(self) -> None:
        self._v = 0.0

    def before_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        trainer.metric_store.start_clock(_clock())

    def before_val_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self._v = _clock()

    def after_val_epoch(self, trainer: TrainerView, metrics: dict | None = None) -> None:  # noqa: D102
        now = _clock()
        trainer.metric_store.update_scalar("val_time", now - self._v)
        trainer.metric_store.start_clock(now)  # validation does not count as the next iteration's data time
