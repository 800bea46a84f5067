"""StallHook: a process that finishes no iteration for a while logs where each of its threads is; rank 0 names the rank.

A watcher thread reads the run's iteration count (no call per training iteration) and, once
it has not moved for ``timeout_s``, logs every thread's Python stack with the rank: where a
hang is (a collective waiting for another rank, a data loader, a lock), before the
collective timeout ends the job. Under several processes it also publishes a heartbeat
(``hooks/heartbeat.py``) through the launcher's store, from which rank 0 says which rank is behind.
It only reports; the run goes on.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from trainwright.hooks.heartbeat import Beat, behind_summary
from trainwright.hooks.hook import Hook
from trainwright.hooks.whereabouts import main_thread_whereabouts
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.dist.side_channel import SideChannel
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

    Under several processes the watcher also publishes this rank's heartbeat every ``beat_s``
    (its iteration, its phase - data, forward, backward, step, a hook, validation, save,
    compile -, the collective it waits in, the top of its stack) into the launcher's store
    (``Strategy.side_channel``: never a collective, which a stuck rank would block). When rank
    0 stalls it reads every rank's heartbeat and logs which rank is behind, where, and which
    collective the others wait in; on NCCL each rank also writes the flight recorder's dump
    beside the log (``Strategy.dump_collective_trace``).

    Args:
        timeout_s: Seconds without a finished iteration before the report.
    """

    def __init__(self, timeout_s: float = 600.0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"StallHook timeout_s must be positive, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        #: Seconds between two heartbeats (and two looks at the iteration count): ``min(timeout_s / 4, 30)``.
        self.beat_s = min(self.timeout_s / 4, 30.0)
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
        period = self.beat_s
        last: tuple[int, int] | None = None
        since = time.monotonic()
        reported = False
        strategy = trainer.strategy
        channel = strategy.side_channel("beat") if strategy.world_size > 1 else None  # this thread's own client
        while not stop.wait(period):
            beat = (trainer.progress.iteration, self._eval_iters)
            now = time.monotonic()
            if beat != last:
                last, since, reported = beat, now, False
            if channel is not None:
                channel.publish(strategy.rank, self._beat(trainer, now - since).dumps())
            if not reported and now - since >= self.timeout_s:
                reported = True
                self.reports += 1
                self._report(trainer, now - since)
                if channel is not None:
                    self._report_ranks(trainer, channel, now - since)

    def _beat(self, trainer: TrainerView, idle_s: float) -> Beat:
        """This rank's heartbeat now."""
        loop = trainer.train_loop
        here = main_thread_whereabouts()
        collective = here.collective
        if collective is None and here.phase == "backward":
            collective = trainer.strategy.backward_collective
        return Beat(
            rank=trainer.strategy.rank,
            iteration=trainer.progress.iteration,
            where=trainer.progress.where(loop is None or loop.by_epoch),
            eval_iters=self._eval_iters,
            phase=here.phase,
            collective=collective,
            top=here.top,
            time=time.time(),
            idle_s=idle_s,
        )

    def _report_ranks(self, trainer: TrainerView, channel: SideChannel, idle_s: float) -> None:
        """Rank 0: which rank is behind, read from every rank's heartbeat; every rank: NCCL's trace beside the log."""
        strategy = trainer.strategy
        try:
            trace = strategy.dump_collective_trace(trainer.run_dir)
        except OSError as e:
            trace = None
            trainer.logger.warning(f"rank {strategy.rank}: could not write the collectives' trace: {e}")
        if trace is not None:
            trainer.logger.warning(f"rank {strategy.rank}: the collectives' trace (NCCL flight recorder) is {trace}")
        if strategy.rank != 0:
            return
        beats = {r: Beat.loads(text) if (text := channel.read(r)) else None for r in range(strategy.world_size)}
        beats[strategy.rank] = self._beat(trainer, idle_s)  # its own, live
        summary = behind_summary(beats, strategy.world_size, time.time(), stale_s=max(3 * self.beat_s, 5.0))
        trainer.logger.warning(f"Stall across the ranks (their heartbeats in the launcher's store): {summary}")
        for handler in trainer.logger.handlers:
            handler.flush()

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
