"""StallHook: a process that finishes no iteration for a while logs where each of its threads is.

A watcher thread reads the run's iteration count (no call per training iteration) and, once
it has not moved for ``timeout_s``, logs every thread's Python stack with the rank: where a
hang is (a collective waiting for another rank, a data loader, a lock), before the
collective timeout ends the job. It only reports; the run goes on.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register
class StallHook(Hook):
    """Logs every thread's stack when no iteration finishes for ``timeout_s`` seconds (default hook ``stall``).

    Training, validation and test iterations count as progress. A stall is reported once, as a
    warning naming the rank (so every rank's report is printed, rank 0's also into
    ``train.log``); after progress resumes, the next stall is reported again. The default,
    600 s, is well under the collective timeout (30 minutes), so the report is there before a
    hung job is ended. A process that is only slow (a long checkpoint write, a first
    compilation) is reported too: raise ``timeout_s`` for such runs.

    Args:
        timeout_s: Seconds without a finished iteration before the report.
    """

    def __init__(self, timeout_s: float = 600.0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"StallHook timeout_s must be positive, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        #: How many stalls this hook has reported (in this process).
        self.reports = 0
        self._eval_iters = 0  # validation / test iterations finished: progress the iteration count does not show
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def before_run(self, trainer: TrainerView) -> None:
        """Start watching (one daemon thread per run call)."""
        self.after_run(trainer)  # a watcher left running (a run call inside another) is replaced, never leaked
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, args=(trainer, self._stop), name="trainwright-stall-watch", daemon=True
        )
        self._thread.start()

    def after_run(self, trainer: TrainerView) -> None:
        """Stop watching."""
        if self._stop is not None and self._thread is not None:
            self._stop.set()
            self._thread.join()
        self._stop = self._thread = None

    def after_val_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:  # noqa: D102
        self._eval_iters += 1

    def after_test_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:  # noqa: D102
        self._eval_iters += 1

    def _watch(self, trainer: TrainerView, stop: threading.Event) -> None:
        period = min(self.timeout_s / 4, 30.0)
        last: tuple[int, int] | None = None
        since = time.monotonic()
        reported = False
        while not stop.wait(period):
            beat = (trainer.progress.iteration, self._eval_iters)
            now = time.monotonic()
            if beat != last:
                last, since, reported = beat, now, False
            elif not reported and now - since >= self.timeout_s:
                reported = True
                self.reports += 1
                self._report(trainer, now - since)

    def _report(self, trainer: TrainerView, waited: float) -> None:
        loop = trainer.train_loop
        names = {t.ident: t.name for t in threading.enumerate()}
        own = threading.get_ident()
        frames = sys._current_frames()  # noqa: SLF001 - the documented way to every thread's current frame
        main = threading.main_thread().ident
        order = sorted((ident for ident in frames if ident != own), key=lambda ident: ident != main)
        stacks = "\n".join(
            f"Thread {names.get(ident, ident)!r}:\n" + "".join(traceback.format_stack(frames[ident])).rstrip()
            for ident in order
        )
        trainer.logger.warning(
            f"No iteration finished on rank {trainer.strategy.rank} for {waited:.3g} s (the run stands "
            f"{trainer.progress.where(loop is None or loop.by_epoch)}). Each thread's stack follows: a hang (a "
            "collective waiting for another rank, a data loader, a lock) shows "
            f"where it waits. If this process is only slow (a long checkpoint write, a first compilation), raise "
            f"default_hooks=dict(stall=dict(timeout_s=...)).\n{stacks}"
        )
        for handler in (
            trainer.logger.handlers
        ):  # the log file now; nothing else (the metric store belongs to the training thread)
            handler.flush()


__all__ = ["StallHook"]
