"""PreemptionHook: on SIGTERM / SIGUSR1, finish the step, save a checkpoint and exit.

The handler only proposes a stop to ``trainer.metric_store.agreement`` (several processes stop after the same
iteration); then ``trainer.checkpoints.save_now()`` writes that step and the process exits with
:attr:`exit_code` (``128 + signal`` by default). A stuck process is ended by a watchdog after
``grace_s``; under SLURM, SIGUSR1 also requeues the job. See docs/checkpoints.md#preemption.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from trainwright.checkpoint.listing import read_latest
from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.hooks.whereabouts import Whereabouts, main_thread_whereabouts
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.dist.side_channel import SideChannel
    from trainwright.hooks.view import RunControlView, TrainerView

_DEFAULT = "signal"

#: The signal that asks for a requeue under SLURM (what ``#SBATCH --signal=USR1@90`` sends).
REQUEUE_SIGNAL = signal.SIGUSR1

#: Copies of one signal that arrive within this many seconds count once: SLURM signals every process of a job step, so a
#: worker gets the signal itself and again from a launcher that forwards it, and forked DataLoader workers report theirs
#: through the same wake-up socket.
SAME_SIGNAL_S = 0.25


def slurm_job_id(env: Any = None) -> str | None:
    """The id ``scontrol requeue`` takes for this job: ``ARRAYID_TASKID`` for an array task, else ``SLURM_JOB_ID``;
    None outside SLURM."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else job


def requeue_slurm_job(job_id: str, timeout_s: float = 60.0) -> str | None:
    """Run ``scontrol requeue JOB_ID``; return None when it succeeded, else why it failed (a sentence)."""
    exe = shutil.which("scontrol")
    if exe is None:
        return "scontrol is not on PATH"
    try:
        done = subprocess.run([exe, "requeue", job_id], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"running scontrol failed: {type(e).__name__}: {e}"
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        return f"scontrol exited with status {done.returncode}" + (f": {said}" if said else "")
    return None


def _signum(sig: int | str | signal.Signals) -> signal.Signals:
    if isinstance(sig, str):
        name = sig.upper() if sig.upper().startswith("SIG") else f"SIG{sig.upper()}"
        if not hasattr(signal, name):
            raise ValueError(f"Unknown signal {sig!r}; use names like 'SIGTERM', 'SIGUSR1' or numbers")
        return signal.Signals(getattr(signal, name))
    return signal.Signals(int(sig))


@HOOKS.register
class PreemptionHook(Hook):
    """Turns a termination signal into "finish this step, save, exit".

    The signal handler only proposes a stop to ``trainer.metric_store.agreement``: one process stops after
    the current step, several together at the loop's next agreement point (the same iteration
    on every rank); a validation inside training is cut too. ``resume=True`` continues from the
    checkpoint. A process that cannot reach a step boundary (stuck in a collective whose peer
    is gone) never runs that handler, so a watchdog thread sees the signal too
    (``signal.set_wakeup_fd``) and applies ``grace_s``.

    Args:
        signals: The signals that mean preemption (default SIGTERM and SIGUSR1).
        check_interval: Under several processes, validation batches between two checks of a
            validation inside training (one small collective each; default 10). Training
            itself stops at the agreement points (``trainer.metric_store.agreement.every``; keep that many
            steps well inside the grace period between signal and kill).
        exit_code: Exit status after the checkpoint is saved: an int, ``"signal"`` (default:
            ``128 + signum``) or None (``train()`` returns normally,
            ``trainer.train_loop.control.preempted`` is True).
        grace_s: After the first signal, seconds to wait for a step boundary (a training
            iteration or validation batch completing; each one restarts the wait) until the
            stop is reached; when none comes - the process is stuck, e.g. in a collective whose
            peer has gone - it exits with ``128 + signum`` without a checkpoint. A second
            signal exits at once. Default 15 s: below torchrun's 30 s between its SIGTERM and
            SIGKILL, so a failed job ends (and an elastic restart begins) sooner; raise it for
            steps slower than that. None: wait for the boundary however long it takes.
            Copies of one signal within 0.25 s count once (SLURM signals the launcher and the
            workers, and the launcher forwards it).
        requeue: Under SLURM (``SLURM_JOB_ID`` set), after saving on SIGUSR1: rank 0 runs
            ``scontrol requeue <job id>`` and every process exits with status 0 (``train()``
            returns normally with ``exit_code=None``). A requeue that fails is logged with the
            command to run by hand, the checkpoint is kept, and the process exits as without
            ``requeue`` (``128 + signum``). Default True.
    """

    priority = "LOWEST"

    def __init__(
        self,
        signals: Sequence[int | str] = ("SIGTERM", "SIGUSR1"),
        check_interval: int | None = None,
        exit_code: int | str | None = _DEFAULT,
        grace_s: float | None = 15.0,
        requeue: bool = True,
    ) -> None:
        if check_interval is not None and check_interval < 1:
            raise ValueError(f"PreemptionHook check_interval must be >= 1, got {check_interval}")
        if grace_s is not None and not grace_s > 0:
            raise ValueError(f"PreemptionHook grace_s must be > 0 seconds (or None: no limit), got {grace_s!r}")
        if isinstance(exit_code, str) and exit_code != _DEFAULT:
            raise ValueError(f"PreemptionHook exit_code must be an int, 'signal' or None, got {exit_code!r}")
        self.signals = [_signum(s) for s in signals]
        self.check_interval = check_interval
        self.exit_code = exit_code
        self.received: signal.Signals | None = None
        self._interval = 10
        self.preempted = False
        self._previous: dict[signal.Signals, Any] = {}
        self._control: RunControlView | None = None  # the train loop's run control when one process trains
        self._in_train = False  # validations inside training are cut too
        self._agreement: Any = None  # the trainer's agreement while training: the handler proposes the stop to it
        self.grace_s = grace_s
        self.requeue = bool(requeue)
        self.requeued = False  # scontrol requeue succeeded for this run (rank 0) / the requeue was decided (every rank)
        self._watchdog: _Watchdog | None = (
            None  # while installed: exits a process that no step boundary reaches after a signal
        )
        self._view: Any = None  # the trainer while training (the watchdog reads its progress and logger)
        self._beats = 0  # step boundaries the iteration count does not show (validation batches, saves)
        self._reached = False  # the stop point was reached: the watchdog stands down
        self._signal_at: float | None = None  # time.monotonic() when the first signal arrived (handler or watchdog)
        self._stop_at: float | None = None  # when the stop was reached (the start of the count on a rank not signalled)
        #: Seconds from the signal (on a rank the signal did not reach: from the agreed stop) to the durable
        #: checkpoint, once a preemption saved one (None before).
        self.signal_to_checkpoint_s: float | None = None

    # -- signal handling ------------------------------------------------------------------
    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # Only record: the loop decides at a step boundary (logging here could deadlock).
        if self.received is None:
            self.received = signal.Signals(signum)
            self.note_signal(time.monotonic())
            if self._control is not None:  # one process: nothing to agree on, the loop stops at the step boundary
                self._control.request_stop(f"preemption ({self.received.name})")
            if self._agreement is not None:
                self._agreement.propose_stop()

    def note_signal(self, at: float) -> None:
        """The first signal arrived at ``at`` (``time.monotonic()``): the start of "signal → durable checkpoint"."""
        if self._signal_at is None or at < self._signal_at:
            self._signal_at = at

    def install(self) -> None:
        """Install the handlers (main thread only; elsewhere signals cannot be caught)."""
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handler)
        if self.grace_s is not None and self._watchdog is None:
            self._watchdog = _Watchdog(self, self.grace_s)

    def uninstall(self) -> None:
        """Put back the handlers that were there before :meth:`install` (and stop the watchdog)."""
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        for s, prev in self._previous.items():
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        self._previous = {}

    # -- events ---------------------------------------------------------------------------
    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self.received = None
        self.preempted = False
        self.requeued = False
        if threading.current_thread() is not threading.main_thread():
            trainer.logger.warning(
                "PreemptionHook: train() runs outside the main thread, so SIGTERM/SIGUSR1 cannot be caught; preemption "
                "will not save a checkpoint"
            )
        self._interval = self.check_interval or 10
        self._in_train = True
        self._control = (
            require_train_loop(trainer, "PreemptionHook").control if trainer.strategy.world_size == 1 else None
        )
        self._agreement = trainer.metric_store.agreement
        self._agreement.reset()
        self._view = trainer
        self._beats = 0
        self._reached = False
        self._signal_at = self._stop_at = None
        self.signal_to_checkpoint_s = None
        self.install()

    def after_val_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:  # noqa: D102
        self._beats += 1  # a step boundary (the watchdog's heartbeat inside a validation)
        # A validation inside training is cut at the next check too (the grace period may be shorter than a pass). One
        # process: the handler already asked the run control to stop (the eval loop reads should_stop).
        if (
            self._in_train
            and self._control is None
            and (batch_idx + 1) % self._interval == 0
            and trainer.strategy.any_true(self.received is not None)
        ):
            self._stop(trainer)

    def before_save_checkpoint(self, trainer: TrainerView, checkpoint: dict) -> None:  # noqa: D102
        self._beats += 1  # a save in progress is not a stuck process

    def _stop(self, trainer: TrainerView) -> None:
        self._reached = True  # the stop point: the watchdog stands down (the save may take longer than the grace)
        self._stop_at = time.monotonic()
        self.preempted = True
        what = self.received.name if self.received is not None else "another rank"
        require_train_loop(trainer, "PreemptionHook").control.request_stop(
            f"preemption ({what})", agreed=True, preemption=True
        )  # a point every rank reaches with the same decision: trainer.train_loop.control.preempted
        trainer.logger.warning(
            f"Preemption ({what}): stopping after iteration {trainer.progress.iteration} and saving a checkpoint"
        )

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._in_train = False
        self._control = None
        if (
            self._agreement is not None and self._agreement.stop and not self.preempted
        ):  # the same decision on every rank
            self._stop(trainer)
        if not self.preempted:
            return
        path = (
            trainer.checkpoints.save_now()
        )  # the checkpoint hook's naming and keep-k when there is one; complete on return
        if path is None:  # saved already at this iteration (the checkpoint hook's last save): name that file
            latest = read_latest(trainer.checkpoints.ckpt_dir)
            saved = (
                f"this iteration was checkpointed already ({trainer.checkpoints.ckpt_dir / latest})"
                if latest
                else "this iteration was checkpointed already"
            )
        else:
            saved = f"checkpoint {path}"
        saved += self._durable(trainer)
        job_id = slurm_job_id() if self.requeue else None
        # the same answer on every rank: the requeue signal reached at least one of them
        if job_id is not None and trainer.strategy.any_true(self.received == REQUEUE_SIGNAL):
            self._requeue(trainer, job_id, saved)
            return
        trainer.logger.warning(
            f"Preempted at iteration {trainer.progress.iteration}: {saved}; restart with resume=True to continue"
        )

    def _durable(self, trainer: TrainerView) -> str:
        """Wait until the checkpoint is durable (a background write, its fsyncs), then measure and record "signal →
        durable checkpoint"; the words for the log line."""
        trainer.strategy.wait_for_checkpoint()
        start = self._signal_at if self._signal_at is not None else self._stop_at
        if start is None:
            return ""
        seconds = self.signal_to_checkpoint_s = time.monotonic() - start
        p = trainer.progress
        record = {"mode": "preemption", "epoch": p.epoch, "iter": p.iteration, "signal_to_checkpoint_s": seconds}
        trainer.log_lines.write_eval(record)  # metrics.jsonl and every writer (rank 0 has them)
        since = "signal" if self._signal_at is not None else "stop agreed (the signal reached another rank)"
        return f", durable {seconds:.2f} s after the {since}"

    def _requeue(self, trainer: TrainerView, job_id: str, saved: str) -> None:
        """Every rank's checkpoint is complete (barrier), then rank 0 asks SLURM to requeue the job."""
        trainer.strategy.barrier()
        failed = None
        if trainer.strategy.is_main_process:
            failed = requeue_slurm_job(job_id)
        failed = trainer.strategy.broadcast_object(failed)
        if failed is None:
            self.requeued = True
            trainer.logger.warning(
                f"Preempted at iteration {trainer.progress.iteration}: {saved}; SLURM job {job_id} requeued (scontrol "
                f"requeue {job_id}); it continues with resume=True"
            )
            return
        if self.received is None:  # another rank got the signal: exit with the status it has
            self.received = REQUEUE_SIGNAL
        it = trainer.progress.iteration
        trainer.logger.error(
            f"Preempted at iteration {it}: the checkpoint of iteration {it} is kept, but SLURM job {job_id} was NOT "
            f"requeued: {failed}. "
            f"Requeue it by hand with `scontrol requeue {job_id}` (or submit the job script again; it continues with "
            "resume=True), "
            "or pass default_hooks=dict(preemption=dict(requeue=False)) to only save and exit"
        )

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        self._in_train = False
        self.uninstall()
        self._agreement = None
        self._view = None
        if not self.preempted:
            return
        self.preempted = False
        code = self.exit_code
        if code is None:
            return
        if self.requeued:
            code = 0  # the job comes back: a clean exit (a non-zero one would make torchrun restart the workers)
        elif code == _DEFAULT:
            code = 128 + int(self.received) if self.received is not None else 143
        trainer.logger.warning(f"Exiting with status {code} after preemption")
        trainer.flush_logs()  # buffered log records must reach the disk
        raise SystemExit(int(code))


class _Watchdog:
    """A thread that sees the hook's signals even while the main thread is stuck in C code (``signal.set_wakeup_fd``).

    After the first signal it waits for step boundaries (the progress's iteration, the hook's
    heartbeats); each restarts the wait, until the stop is reached (the agreed stop, or on one
    process the first boundary after the signal). If ``grace_s`` pass without one, or a second
    signal arrives, it logs why and ends the process with ``128 + signum`` (``os._exit``: the
    main thread cannot be interrupted).
    """

    def __init__(self, hook: PreemptionHook, grace_s: float) -> None:
        self.hook, self.grace_s = hook, grace_s
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        self._done = threading.Event()
        # after a signal, under several processes: this rank's note (where its main thread is) for the others, and the
        # notes' sequence numbers last read from them (a note whose number moves comes from a live watchdog)
        self._channel: SideChannel | None = None
        self._channel_tried = False
        self._seq = 0
        self._seen: dict[int, int] = {}
        self._thread = threading.Thread(target=self._run, name="trainwright-preemption-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stand down, put back the previous wakeup fd (main thread)."""
        self._done.set()
        signal.set_wakeup_fd(self._previous_fd)
        try:
            self._write.send(b"\0")  # wakes the thread (0 is no signal number)
        except OSError:
            pass
        self._thread.join(timeout=1.0)
        self._read.close()
        self._write.close()

    def _beat(self) -> tuple[int, int]:
        view = self.hook._view
        return (getattr(getattr(view, "progress", None), "iteration", -1), self.hook._beats)

    def _run(self) -> None:
        ours = {int(s) for s in self.hook.signals}
        first: int | None = None
        first_at = 0.0
        deadline = beat = None
        waited = False  # said once that the main thread's own work outlasts the grace
        while not self._done.is_set():
            try:
                # no wake-ups while no signal came (the training step pays nothing); then 5 a second
                ready, _, _ = select.select([self._read], [], [], None if deadline is None else 0.2)
                got = self._read.recv(64) if ready else b""
            except OSError:
                return  # closed by stop()
            if self._done.is_set():
                return
            now = time.monotonic()
            for signum in (b for b in got if b in ours):
                if first is not None:
                    if now - first_at < SAME_SIGNAL_S:
                        # one signal delivered several ways (SLURM and a forwarding launcher, DataLoader workers)
                        continue
                    self._exit(signum, f"a second {signal.Signals(signum).name} arrived before the stop was reached")
                first, first_at, deadline, beat = signum, now, now + self.grace_s, self._beat()
                self.hook.note_signal(now)
                self._say_received(signum)
            if first is None or deadline is None:
                continue
            self._publish()
            now_beat = self._beat()
            if now_beat != beat or self.hook._reached:  # a step boundary came: the process is alive
                agreement = self.hook._agreement
                if self.hook._reached or agreement is None or agreement.local or agreement.stop:
                    deadline = (
                        None  # the stop point (one process: the first boundary; several: the agreed stop): stand down
                    )
                    continue
                beat, deadline = now_beat, time.monotonic() + self.grace_s
            elif deadline is not None and time.monotonic() > deadline:
                where = main_thread_whereabouts()
                if self._own_work(where):  # a batch fetch, a compile, a save, a step on one process: it ends
                    if not waited:
                        waited = True
                        self._say(
                            f"Preemption: the main thread is in {where.phase} past grace_s={self.grace_s} s, work "
                            "that ends by itself: waiting for it, then saving (see docs/reliability.md)"
                        )
                    beat, deadline = now_beat, time.monotonic() + self.grace_s
                    continue
                peer = self._working_peer() if self._waits_for_others(where) else None
                if peer is not None:  # the rank it waits for is alive, in work that ends by itself
                    if not waited:
                        waited = True
                        self._say(
                            f"Preemption: this rank waits in {self._collective(where)} past grace_s={self.grace_s} s "
                            f"for {peer}, work that ends by itself: waiting for it, then saving"
                        )
                    beat, deadline = now_beat, time.monotonic() + self.grace_s
                    continue
                self._exit(
                    first,
                    f"no step boundary within grace_s={self.grace_s} s after {signal.Signals(first).name} (the process "
                    f"is stuck, in {self._collective(where)}: e.g. a collective whose peer has gone)",
                )

    def _publish(self) -> None:
        """Several processes: leave where this rank's main thread is in the launcher's store (5 times a second after a
        signal), so a rank that waits for this one in a collective knows it is alive and working."""
        strategy = getattr(self.hook._view, "strategy", None)
        if self._channel is None and not self._channel_tried:
            self._channel_tried = True
            if strategy is not None and strategy.world_size > 1:
                self._channel = strategy.side_channel("preempt")  # this thread's own client
        if self._channel is None or strategy is None:
            return
        where = main_thread_whereabouts(top=0)
        self._seq += 1
        note = {"seq": self._seq, "own_work": self._own_work(where), "phase": where.phase}
        self._channel.publish(strategy.rank, json.dumps(note))

    def _working_peer(self) -> str | None:
        """Another rank whose watchdog is alive (its note moved since the last look) and whose main thread is in work
        that ends by itself: ``"rank 1 (in data)"``; None when there is none."""
        strategy = getattr(self.hook._view, "strategy", None)
        if self._channel is None or strategy is None:
            return None
        found = None
        for r in range(strategy.world_size):
            text = self._channel.read(r) if r != strategy.rank else None
            try:
                note = json.loads(text) if text else None
            except ValueError:
                note = None
            if not isinstance(note, dict):
                continue
            moved = note.get("seq") != self._seen.get(r)
            self._seen[r] = note.get("seq", -1)
            if moved and note.get("own_work") and found is None:
                found = f"rank {r} (in {note.get('phase')})"
        return found

    def _own_work(self, where: Whereabouts) -> bool:
        """Whether the main thread is in work of trainwright's that ends by itself (a batch fetch, a compilation, a
        checkpoint save, a validation batch, a step that waits for no other rank): the preemption waits for it. A
        hook (user code) and a wait for other ranks may never end: they get ``grace_s``."""
        if where.phase.startswith("hook ") or where.phase == "other":
            return False
        return not self._waits_for_others(where)

    def _waits_for_others(self, where: Whereabouts) -> bool:
        """Whether the main thread waits for other ranks (a collective; a backward or a sharded forward that makes
        one): then it may wait for a rank that has gone."""
        strategy = getattr(self.hook._view, "strategy", None)
        if strategy is None or strategy.world_size == 1:
            return False
        if where.collective is not None:
            return True
        if where.phase == "backward":
            return strategy.backward_collective is not None
        return where.phase == "forward" and not strategy.forward_is_local

    def _collective(self, where: Whereabouts) -> str:
        strategy = getattr(self.hook._view, "strategy", None)
        backward = strategy.backward_collective if strategy is not None and where.phase == "backward" else None
        named = where.collective or backward
        return f"{where.phase}, {named}" if named else where.phase

    def _say(self, message: str) -> None:
        logger = getattr(self.hook._view, "logger", None)
        if logger is not None:
            logger.warning(message)
            for h in logger.handlers:
                h.flush()

    def _say_received(self, signum: int) -> None:
        """Log the signal as soon as it comes (the handler may not log) and where the main thread is: a slow fetch,
        compile or save after it then has a line before it."""
        finished = self._beat()[0]
        where = main_thread_whereabouts()
        self._say(
            f"Preemption signal {signal.Signals(signum).name} received after iteration {finished} (the main thread is "
            f"in {where.phase}): stopping at the next step boundary, then saving a checkpoint"
        )

    def _exit(self, signum: int, why: str) -> None:
        code = 128 + signum
        msg = f"PreemptionHook: {why}: exiting now with status {code}, without a checkpoint"
        logger = getattr(self.hook._view, "logger", None)
        try:
            if logger is not None:
                logger.error(msg)
                for h in logger.handlers:
                    h.flush()
            else:
                sys.stderr.write(msg + "\n")
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
