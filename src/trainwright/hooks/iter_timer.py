"""IterTimerHook: data_time, iter_time and the ETA."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer

_clock = time.perf_counter


@HOOKS.register
class IterTimerHook(Hook):
    """Records ``data_time`` (waiting for the batch) and ``time`` (the whole iteration).

    Both are plain ``time.perf_counter`` differences: no device synchronisation, so on
    accelerators ``time`` measures the host's view (it converges to the device's pace
    because the queue of launched work is bounded). On the hot path nothing is called: the
    hook hands the train loop a list (``loop.iter_marks``) that the loop appends a timestamp
    to before and after each step; the timestamps become ``data_time`` / ``time`` values in
    the metric store when it is flushed, with the iteration they belong to.
    """

    priority = "VERY_HIGH"

    def __init__(self) -> None:
        self._marks: list[float] = []  # before_train_iter, after_train_iter, before, after, ...
        self._first = 1  # the iteration of the first (before, after) pair in _marks (iterations are consecutive)
        self._prev = 0.0  # end of the previous iteration (or start of the epoch)
        self._v = 0.0
        self._store: Any = None

    def before_train(self, trainer: Trainer) -> None:  # noqa: D102
        self._store = trainer.metric_store
        self._store.add_drain(self._drain)
        trainer.train_loop.iter_marks = self._marks  # type: ignore[union-attr]

    def after_train(self, trainer: Trainer) -> None:  # noqa: D102
        trainer.train_loop.iter_marks = None  # type: ignore[union-attr]

    def before_train_epoch(self, trainer: Trainer) -> None:  # noqa: D102
        self._drain()
        self._marks.clear()
        self._first = trainer.progress.iteration + 1
        self._prev = _clock()

    def _drain(self) -> None:
        """Turn complete (before, after) timestamp pairs into ``data_time`` / ``time`` values."""
        marks = self._marks
        n = len(marks) // 2  # complete (before, after) pairs; an odd mark is an iteration in progress
        if not n or self._store is None:
            return
        iters = list(range(self._first, self._first + n))
        ends = [self._prev, *marks[1 : 2 * n : 2]]  # end of the previous iteration, then each 'after'
        self._store.update_scalars("data_time", [b - e for b, e in zip(marks[0 : 2 * n : 2], ends)], iters)
        self._store.update_scalars("time", [a - e for a, e in zip(ends[1:], ends)], iters)
        self._prev = ends[-1]
        self._first += n
        del marks[: 2 * n]

    def before_val_epoch(self, trainer: Trainer) -> None:  # noqa: D102
        self._v = _clock()

    def after_val_epoch(self, trainer: Trainer, metrics: dict | None = None) -> None:  # noqa: D102
        trainer.metric_store.update_scalar("val_time", _clock() - self._v)
        self._drain()
        self._prev = _clock()  # validation time does not count as training data time
