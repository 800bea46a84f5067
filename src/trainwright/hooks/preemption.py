"""PreemptionHook: on SIGTERM / SIGUSR1, finish the step, save a checkpoint and exit.

Clusters announce preemption with a signal some time before they kill the job (SLURM
sends SIGTERM, or the signal given with ``--signal=USR1@90``; Kubernetes and most cloud
spot instances send SIGTERM). The hook's signal handler only records the signal (in a
one-process run it also sets ``trainer.should_stop``, which the loop reads at every step
boundary: nothing to agree on, so no per-iteration check). With several processes the
handler also proposes a stop to the metric store (``metric_store.stop_requested``), whose
next flush carries it in the one collective it makes anyway (with the log lines' numbers
and the NaN check), and the decision is taken in one place,
:meth:`PreemptionHook.after_train_iter`: at its check iterations every process reads
``metric_store.stop_agreed`` - after asking the store to agree (``agree()``) only
when the logger has not flushed at this iteration already, so with the default intervals
(both 10) the check costs no collective of its own. The store makes its collective only at
agreement points, about ``metric_store.agree_secs`` (1 s) apart, and it is answered at the
next point (it is started without waiting), so a signal is acted on within about two
``agree_secs`` (at most ``2 * metric_store.flush_every`` iterations), or at the first check
after an epoch end or checkpoint (their blocking flush settles it) if one comes first. All ranks stop after the same step (no
rank waits forever in a collective of a step the others skipped). Then the loop ends, a checkpoint of that step is written by
``trainer.checkpoints.save_now()`` (with the :class:`~trainwright.hooks.CheckpointHook`'s
naming and keep-last-k when there is one; complete when it returns), the previous signal handlers are
put back and the process exits with :attr:`exit_code` (by default ``128 + signal``, the
status a shell reports for a process ended by that signal: 143 for SIGTERM, 138 for
SIGUSR1). The next start with ``resume=True`` continues from that checkpoint.

A signal during a validation inside training ends the pass at the next batch (one process:
the eval loop reads ``trainer.should_stop``; several: the same agreement point, every
``check_interval`` validation batches): the pass reports no metrics, the checkpoint due
at that point is written, and the run exits as above.

With ``exit_code=None`` ``train()`` returns normally instead, with
``trainer.preempted = True`` (useful in notebooks and tests).
"""

from __future__ import annotations

import signal
import threading
import weakref
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView

_DEFAULT = "signal"


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

    Args:
        signals: The signals that mean preemption (default SIGTERM and SIGUSR1).
        check_interval: Iterations between checks of the agreement point; under several
            processes it defaults to 10 (the logger's default interval: the check reads the
            agreement of the logger's flush; at an agreement point where the logger did not
            flush, the check is one small collective). With the
            default (None) on one process there is no check at all: the signal handler sets
            ``trainer.should_stop`` and the loop stops after the current step. Keep the wait
            (``check_interval`` steps) well inside the grace period between signal and kill.
        exit_code: Exit status after the checkpoint is saved: an int, ``"signal"`` (default:
            ``128 + signum``) or None (``train()`` returns normally, ``trainer.preempted`` is True).
    """

    priority = "LOWEST"

    def __init__(self, signals: Sequence[int | str] = ("SIGTERM", "SIGUSR1"), check_interval: int | None = None, exit_code: int | str | None = _DEFAULT) -> None:
        if check_interval is not None and check_interval < 1:
            raise ValueError(f"PreemptionHook check_interval must be >= 1, got {check_interval}")
        if isinstance(exit_code, str) and exit_code != _DEFAULT:
            raise ValueError(f"PreemptionHook exit_code must be an int, 'signal' or None, got {exit_code!r}")
        self.signals = [_signum(s) for s in signals]
        self.check_interval = check_interval
        self.exit_code = exit_code
        self.received: signal.Signals | None = None
        self._interval = 1
        self.preempted = False
        self._previous: dict[signal.Signals, Any] = {}
        self._trainer_ref: weakref.ref | None = None  # set when one process trains: the handler stops it
        self._in_train = False  # validations inside training check the agreement point too
        self._store: Any = None  # the trainer's metric store while training: the handler proposes the stop to it

    # -- signal handling ------------------------------------------------------------------
    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # Only record: the loop decides at a step boundary (logging here could deadlock).
        if self.received is None:
            self.received = signal.Signals(signum)
            trainer = self._trainer_ref() if self._trainer_ref is not None else None
            if trainer is not None:  # one process: nothing to agree on, the loop stops at the step boundary
                trainer.should_stop = True
            if self._store is not None:  # carried by the store's next agreeing flush
                self._store.stop_requested = True

    def install(self) -> None:
        """Install the handlers (main thread only; elsewhere signals cannot be caught)."""
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handler)

    def uninstall(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for s, prev in self._previous.items():
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        self._previous = {}

    # -- events ---------------------------------------------------------------------------
    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self.received = None
        self.preempted = False
        trainer.preempted = False
        if threading.current_thread() is not threading.main_thread():
            trainer.logger.warning("PreemptionHook: train() runs outside the main thread, so SIGTERM/SIGUSR1 cannot be caught; preemption will not save a checkpoint")
        self._interval = self.check_interval or (1 if trainer.strategy.world_size == 1 else 10)
        self._in_train = True
        self._trainer_ref = weakref.ref(trainer) if trainer.strategy.world_size == 1 and self.check_interval is None else None
        self._store = trainer.metric_store
        self._store.stop_requested = self._store.stop_agreed = False
        self.install()

    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        # One process: the signal handler sets trainer.should_stop itself; no per-iteration check.
        return 0 if self._trainer_ref is not None else self._interval

    def after_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        # THE agreement point: every rank reads it at the same iterations and gets the same answer.
        store = trainer.metric_store
        if store.synced_at < trainer.progress.iteration:  # the logger did not flush here: agree now (one collective)
            store.agree(iteration=trainer.progress.iteration)
        if store.stop_agreed:
            self._stop(trainer)

    def after_val_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:  # noqa: D102
        # A validation inside training is cut at the next check too (the grace period may be shorter
        # than a pass). One process: the handler already set trainer.should_stop, which the eval loop reads.
        if self._in_train and self._trainer_ref is None and (batch_idx + 1) % self._interval == 0 and trainer.strategy.any_true(self.received is not None):
            self._stop(trainer)

    def _stop(self, trainer: TrainerView) -> None:
        self.preempted = True
        trainer.preempted = True
        trainer.should_stop = True
        what = self.received.name if self.received is not None else "another rank"
        trainer.logger.warning(f"Preemption signal ({what}) received: stopping after iteration {trainer.progress.iteration} and saving a checkpoint")

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._in_train = False
        if self._trainer_ref is not None:
            self._trainer_ref = None
            if self.received is not None and not self.preempted:
                self._stop(trainer)
        if not self.preempted:
            return
        path = trainer.checkpoints.save_now()  # the checkpoint hook's naming and keep-k when there is one; complete on return
        saved = f"checkpoint {path}" if path is not None else "this iteration was checkpointed already"
        trainer.logger.warning(f"Preempted at iteration {trainer.progress.iteration}: {saved}; restart with resume=True to continue")

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        self._in_train = False
        self.uninstall()
        self._store = None
        if not self.preempted:
            return
        self.preempted = False
        code = self.exit_code
        if code is None:
            return
        if code == _DEFAULT:
            code = 128 + int(self.received) if self.received is not None else 143
        trainer.logger.warning(f"Exiting with status {code} after preemption")
        trainer.flush_logs()  # buffered log records must reach the disk
        raise SystemExit(int(code))
