"""PreemptionHook: on SIGTERM / SIGUSR1, finish the step, save a checkpoint and exit.

Clusters announce preemption with a signal before they kill the job (SLURM: SIGTERM or
``--signal=USR1@90``; Kubernetes, spot instances: SIGTERM). The handler only proposes a stop
to ``trainer.agreement``: one process stops after the current step, several together at the
loop's next agreement point (the same iteration on every rank); a validation inside training
is cut too. Then ``trainer.checkpoints.save_now()`` writes that step and the process exits
with :attr:`exit_code` (``128 + signal`` by default); ``resume=True`` continues from it.
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
        check_interval: Under several processes, validation batches between two checks of a
            validation inside training (one small collective each; default 10). Training
            itself stops at the agreement points (``trainer.agreement.every``; keep that many
            steps well inside the grace period between signal and kill).
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
        self._interval = 10
        self.preempted = False
        self._previous: dict[signal.Signals, Any] = {}
        self._trainer_ref: weakref.ref | None = None  # set when one process trains: the handler stops it
        self._in_train = False  # validations inside training are cut too
        self._agreement: Any = None  # the trainer's agreement while training: the handler proposes the stop to it

    # -- signal handling ------------------------------------------------------------------
    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # Only record: the loop decides at a step boundary (logging here could deadlock).
        if self.received is None:
            self.received = signal.Signals(signum)
            trainer = self._trainer_ref() if self._trainer_ref is not None else None
            if trainer is not None:  # one process: nothing to agree on, the loop stops at the step boundary
                trainer.should_stop = True
            if self._agreement is not None:
                self._agreement.propose_stop()

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
        self._interval = self.check_interval or 10
        self._in_train = True
        self._trainer_ref = weakref.ref(trainer) if trainer.strategy.world_size == 1 else None
        self._agreement = trainer.metric_store.agreement
        self._agreement.reset()
        self.install()

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
        self._trainer_ref = None
        if self._agreement is not None and self._agreement.stop and not self.preempted:  # the same decision on every rank
            self._stop(trainer)
        if not self.preempted:
            return
        path = trainer.checkpoints.save_now()  # the checkpoint hook's naming and keep-k when there is one; complete on return
        saved = f"checkpoint {path}" if path is not None else "this iteration was checkpointed already"
        trainer.logger.warning(f"Preempted at iteration {trainer.progress.iteration}: {saved}; restart with resume=True to continue")

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        self._in_train = False
        self.uninstall()
        self._agreement = None
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
