"""TrainerView: the narrow view of the trainer that hooks are typed against.

Hooks receive the trainer as an argument at every event. They are typed against this
Protocol rather than the ``Trainer`` class, so the hooks layer does not depend on the
trainer layer above it and a hook's author sees exactly what a hook may rely on. The
``Trainer`` satisfies it structurally (checked by a test and by mypy where a trainer is
passed as a view).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trainwright.checkpoint.manager import CheckpointManager

if TYPE_CHECKING:
    from trainwright.logging.lines import PendingLines
    from trainwright.logging.message_hub import MessageHub
    from trainwright.logging.metric_store import MetricStore
    from trainwright.strategies.base import Strategy
    from trainwright.utils.progress import Progress


class TrainLoopView(Protocol):
    """What hooks read of the training loop."""

    by_epoch: bool
    dataloader: Any

    @property
    def max_iters(self) -> int:
        """Total training iterations of the run."""

    def val_due(self) -> bool:
        """Whether validation runs right after the current iteration's / epoch's hooks."""

    @property
    def control(self) -> RunControlView:
        """The running loop's stop / restart requests (:class:`~trainwright.loops.control.RunControl`)."""

    def restart_from(self, iteration: int) -> None:
        """After this iteration's hooks, go on from ``iteration``, where a hook has just restored the run (the spike
        guard's rollback)."""

    def request_restart(self) -> None:
        """``restart_from(progress.iteration)`` (kept for older callers)."""


class RunControlView(Protocol):
    """What hooks use of the loop's run control (:class:`~trainwright.loops.control.RunControl`)."""

    preempted: bool

    def request_stop(self, reason: str, *, agreed: bool = False, preemption: bool = False) -> None:
        """End training after the current iteration (several processes: at the next agreement point; ``agreed``:
        decided on every rank now; ``preemption``: a stop signal's, :attr:`preempted`)."""

    def restart_from(self, iteration: int) -> None:
        """Go on from ``iteration`` after the current one's hooks (call it on every rank at the same iteration)."""


class EvalLoopView(Protocol):
    """What hooks read of a validation / test loop."""

    evaluator: Any

    def run_pass(self, with_hooks: bool = True) -> dict[str, float] | None:
        """One pass over the data with the model as it is; metric keys without the mode prefix (None: a stop request
        cut it short)."""


class TrainerView(Protocol):
    """The trainer as hooks see it: state, the objects that hold it, and the few requests a hook may make.

    Attributes:
        progress: Epoch, iteration and position in the epoch (the one source of the position).
        should_stop: Whether training ends after the current iteration (the loop's stop flag). Setting it True is the
            deprecated spelling of ``trainer.train_loop.control.request_stop(reason)``.
        logger: The run's logger (rank-aware).
        metric_store: Owner of every logged number; its ``agreement`` holds the stop / NaN / write
            decisions every process takes together.
        log_lines: Training log lines held for batched writing; its ``writers`` are where records
            go (empty on every process but rank 0).
        strategy: Devices, processes, collectives and checkpoint I/O.
        optim_wrapper: The OptimWrapper (or OptimWrapperDict) of the run.
        param_schedulers: The parameter schedulers (list, or dict per optimizer).
        run_dir: This run's folder (``work_dir/<experiment_name>``: log, metrics, traces).
        checkpoints: Saving, naming, ``latest``, keep-k, save-now requests and restore.
        message_hub: mmengine's message hub: the run's facts, logged scalars, what hooks write.
    """

    progress: Progress
    should_stop: bool
    logger: logging.Logger
    metric_store: MetricStore
    log_lines: PendingLines
    strategy: Strategy
    optim_wrapper: Any
    param_schedulers: Any
    run_dir: Path
    checkpoints: CheckpointManager
    message_hub: MessageHub

    @property
    def train_loop(self) -> TrainLoopView | None:
        """The training loop (exists once ``train()`` or ``resume_from()`` built it); see :func:`require_train_loop`."""

    @property
    def val_loop(self) -> EvalLoopView | None:
        """The validation loop, if a val_dataloader was given."""

    @property
    def test_loop(self) -> EvalLoopView | None:
        """The test loop, if a test_dataloader was given."""

    @property
    def unwrapped_model(self) -> Any:
        """The user's model, without distributed wrappers or the plain-module adapter."""

    def flush_logs(self) -> None:
        """Make everything logged so far visible on disk."""


def require_train_loop(trainer: TrainerView, who: str) -> TrainLoopView:
    """``trainer.train_loop``, or a RuntimeError saying that ``who`` only works while training."""
    loop = trainer.train_loop
    if loop is None:
        raise RuntimeError(
            f"{who} needs the training loop, which exists once trainer.train() (or resume_from) has built it"
        )
    return loop
