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

    Args:
        warmup_iter: detectron2's ``IterationTimer(warmup_iter=...)``: an iteration is timed
            once ``warmup_iter`` iterations of this ``train()`` (counted from the iteration it
            starts or resumes at, the current one included) are done, so the first
            ``warmup_iter - 1`` get no ``data_time`` / ``time`` and start-up costs (worker
            start, allocator and kernel warm-up, compilation) stay out of the logged means and
            the ETA. 0 (the default, as mmengine's IterTimerHook) and 1 time every iteration.
    """

    priority = "VERY_HIGH"

    def __init__(self, warmup_iter: int = 0) -> None:
        if not isinstance(warmup_iter, int) or warmup_iter < 0:
            raise ValueError(
                f"IterTimerHook warmup_iter must be an int >= 0 (iterations left out of the times), got {warmup_iter!r}"
            )
        self.warmup_iter = warmup_iter
        self._v = 0.0

    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        # detectron2 times an iteration when iter_done (1-based) >= warmup_iter
        trainer.metric_store.skip_times_until(trainer.progress.iteration + max(self.warmup_iter - 1, 0))

    def before_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        trainer.metric_store.start_clock(_clock())

    def before_val_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self._v = _clock()

    def after_val_epoch(self, trainer: TrainerView, metrics: dict | None = None) -> None:  # noqa: D102
        now = _clock()
        trainer.metric_store.update_scalar("val_time", now - self._v)
        trainer.metric_store.start_clock(now)  # validation does not count as the next iteration's data time
