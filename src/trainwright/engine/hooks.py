"""detectron2's stock hooks (``detectron2.engine.hooks``) for :class:`~trainwright.engine.TrainerBase`.

Provided: ``CallbackHook``, ``IterationTimer``, ``PeriodicWriter``, ``PeriodicCheckpointer``,
``LRScheduler`` (a torch scheduler), ``EvalHook``. Not provided (docs/parity.md says what to use
instead): ``BestCheckpointer``, ``PreciseBN``, ``TorchProfiler``, ``AutogradProfiler``,
``TorchMemoryStats``, fvcore ``ParamScheduler`` objects in ``LRScheduler``.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from trainwright import dist
from trainwright.engine.checkpointer import Checkpointer
from trainwright.engine.train_loop import HookBase

__all__ = ["CallbackHook", "EvalHook", "IterationTimer", "LRScheduler", "PeriodicCheckpointer", "PeriodicWriter"]

logger = logging.getLogger("trainwright.engine")

TrainerCallback = Callable[[Any], None]


class CallbackHook(HookBase):
    """A hook made of functions, each called with the trainer.

    Args:
        before_train, after_train, before_step, after_step: Optional functions of one
            argument (the trainer).
    """

    def __init__(
        self,
        *,
        before_train: TrainerCallback | None = None,
        after_train: TrainerCallback | None = None,
        before_step: TrainerCallback | None = None,
        after_step: TrainerCallback | None = None,
    ) -> None:
        self._before_train, self._after_train = before_train, after_train
        self._before_step, self._after_step = before_step, after_step

    def before_train(self) -> None:  # noqa: D102
        if self._before_train is not None:
            self._before_train(self.trainer)

    def after_train(self) -> None:  # noqa: D102
        if self._after_train is not None:
            self._after_train(self.trainer)

    def before_step(self) -> None:  # noqa: D102
        if self._before_step is not None:
            self._before_step(self.trainer)

    def after_step(self) -> None:  # noqa: D102
        if self._after_step is not None:
            self._after_step(self.trainer)


def _hms(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


class IterationTimer(HookBase):
    """Put each step's duration as ``time`` and log the training speed at the end.

    A step is timed from this hook's ``before_step`` to its ``after_step``: register it first
    so the other hooks' ``after_step`` work is not counted (the end-of-training line reports it
    separately as time on hooks).

    Args:
        warmup_iter: The first ``warmup_iter - 1`` steps of each ``train()`` are not timed
            (detectron2's counting: a step is timed once ``iterations done >= warmup_iter``).
    """

    def __init__(self, warmup_iter: int = 3) -> None:
        self._warmup_iter = warmup_iter
        self._train_start = self._step_start = time.perf_counter()
        self._timed_seconds = 0.0
        self._timed_steps = 0

    def before_train(self) -> None:  # noqa: D102
        self._train_start = time.perf_counter()
        self._timed_seconds, self._timed_steps = 0.0, 0

    def before_step(self) -> None:  # noqa: D102
        self._step_start = time.perf_counter()

    def after_step(self) -> None:  # noqa: D102
        seconds = time.perf_counter() - self._step_start
        if self.trainer.iter - self.trainer.start_iter + 1 >= self._warmup_iter:
            self.trainer.storage.put_scalars(time=seconds)
            self._timed_seconds += seconds
            self._timed_steps += 1
        else:  # the warm-up counts neither in the speed nor in the total
            self._train_start = time.perf_counter()

    def after_train(self) -> None:  # noqa: D102
        total = time.perf_counter() - self._train_start
        if self._timed_steps and self._timed_seconds > 0:
            logger.info(
                "Overall training speed: %d iterations in %s (%.4f s / it)",
                self._timed_steps,
                _hms(self._timed_seconds),
                self._timed_seconds / self._timed_steps,
            )
        logger.info("Total training time: %s (%s on hooks)", _hms(total), _hms(total - self._timed_seconds))


class PeriodicWriter(HookBase):
    """Call ``write()`` on each writer every ``period`` iterations and after the last; ``close()`` them after training.

    Args:
        writers: Objects with ``write()`` and ``close()`` that read
            :func:`~trainwright.engine.get_event_storage` (detectron2's ``EventWriter``
            protocol), e.g. :class:`~trainwright.engine.writers.JSONWriter`,
            :class:`~trainwright.engine.writers.CommonMetricPrinter`.
        period: Iterations between writes.
    """

    def __init__(self, writers: Iterable[Any], period: int = 20) -> None:
        self._writers = list(writers)
        for w in self._writers:
            if not (callable(getattr(w, "write", None)) and callable(getattr(w, "close", None))):
                raise TypeError(
                    f"PeriodicWriter needs writers with write() and close() methods, got {type(w).__name__}"
                )
        if not isinstance(period, int) or period < 1:
            raise ValueError(f"PeriodicWriter period must be an int >= 1, got {period!r}")
        self._period = period

    def after_step(self) -> None:  # noqa: D102
        it = self.trainer.iter
        if (it + 1) % self._period == 0 or it == self.trainer.max_iter - 1:
            for w in self._writers:
                w.write()

    def after_train(self) -> None:  # noqa: D102
        for w in self._writers:
            w.write()  # what after_train hooks before this one put
            w.close()


class PeriodicCheckpointer(HookBase):
    """Save ``<file_prefix>_<iter:07d>`` every ``period`` iterations and ``<file_prefix>_final`` at the last.

    Each file holds ``{"iteration": trainer.iter}`` besides the checkpointer's pieces; resume
    with ``trainer.train(trainer.iter + 1, max_iter)`` after ``checkpointer.resume_or_load``.

    Args:
        checkpointer: A :class:`~trainwright.engine.Checkpointer` (or any object with
            ``save(name, **extra)`` and ``remove(name)``).
        period: Iterations between saves.
        max_iter: The run's last iteration + 1 (default: the trainer's ``max_iter``).
        max_to_keep: Keep only this many periodic files (``_final`` is never deleted).
        file_prefix: The files' name prefix.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        period: int,
        max_iter: int | None = None,
        max_to_keep: int | None = None,
        file_prefix: str = "model",
    ) -> None:
        if not isinstance(period, int) or period < 1:
            raise ValueError(f"PeriodicCheckpointer period must be an int >= 1, got {period!r}")
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None (keep all), got {max_to_keep}")
        self.checkpointer = checkpointer
        self.period = period
        self.max_iter = max_iter
        self.max_to_keep = max_to_keep
        self.file_prefix = file_prefix
        self._recent: list[str] = []

    def before_train(self) -> None:  # noqa: D102
        if self.max_iter is None:
            self.max_iter = self.trainer.max_iter

    def step(self, iteration: int, **kwargs: Any) -> None:
        """Save if ``iteration`` (0-based, just done) is due; ``kwargs`` go into the file."""
        extra = {"iteration": int(iteration), **kwargs}
        if (iteration + 1) % self.period == 0:
            name = f"{self.file_prefix}_{iteration:07d}"
            self.checkpointer.save(name, **extra)
            if self.max_to_keep is not None:
                self._recent.append(name)
                while len(self._recent) > self.max_to_keep:
                    self.checkpointer.remove(self._recent.pop(0))
        if self.max_iter is not None and iteration >= self.max_iter - 1:
            self.checkpointer.save(f"{self.file_prefix}_final", **extra)

    def after_step(self) -> None:  # noqa: D102
        self.step(self.trainer.iter)


def _summary_group(optimizer: torch.optim.Optimizer) -> int:
    """The param group whose lr is logged: the one with the most parameters; if every group has one, the first with
    the most common lr."""
    groups = optimizer.param_groups
    sizes = [len(g["params"]) for g in groups]
    if max(sizes) > 1:
        return sizes.index(max(sizes))
    common = Counter(g["lr"] for g in groups).most_common(1)[0][0]
    return next(i for i, g in enumerate(groups) if g["lr"] == common)


class LRScheduler(HookBase):
    """Put the learning rate as ``lr`` and step a torch scheduler after every iteration.

    Args:
        optimizer: The optimizer (default: ``trainer.optimizer``).
        scheduler: A ``torch.optim.lr_scheduler.LRScheduler`` (default: ``trainer.scheduler``).
            fvcore ``ParamScheduler`` objects are not provided: wrap the multiplier in a
            ``torch.optim.lr_scheduler.LambdaLR``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None) -> None:
        self._optimizer = optimizer
        self._scheduler = scheduler
        self._group = 0

    @property
    def scheduler(self) -> Any:
        """The scheduler stepped (the one given, else the trainer's ``scheduler``)."""
        return self._scheduler if self._scheduler is not None else getattr(self.trainer, "scheduler", None)

    def before_train(self) -> None:  # noqa: D102
        self._optimizer = self._optimizer if self._optimizer is not None else self.trainer.optimizer
        sched = self.scheduler
        if not (callable(getattr(sched, "step", None)) and callable(getattr(sched, "state_dict", None))):
            raise TypeError(
                "LRScheduler needs a torch.optim.lr_scheduler.LRScheduler (given, or as trainer.scheduler), got "
                f"{type(sched).__name__}; "
                "for a multiplier function use torch.optim.lr_scheduler.LambdaLR(optimizer, fn)"
            )
        self._group = _summary_group(self._optimizer)

    def after_step(self) -> None:  # noqa: D102
        assert self._optimizer is not None
        self.trainer.storage.put_scalar("lr", self._optimizer.param_groups[self._group]["lr"], smoothing_hint=False)
        self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state."""
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the scheduler's state."""
        self.scheduler.load_state_dict(state_dict)


def _flatten(results: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in results.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


class EvalHook(HookBase):
    """Run an evaluation function every ``eval_period`` iterations and after the last; put its results.

    Args:
        eval_period: Iterations between evaluations; 0: only after training.
        eval_function: Called with no argument; returns a (nested) dict of numbers, put as
            scalars named ``"a/b"`` for ``{"a": {"b": ...}}``, or None. Run it on every rank.
        eval_after_train: Also evaluate after the last iteration.
    """

    def __init__(
        self, eval_period: int, eval_function: Callable[[], Mapping[str, Any] | None], eval_after_train: bool = True
    ) -> None:
        self._period = eval_period
        self._func = eval_function
        self._eval_after_train = eval_after_train

    def _do_eval(self) -> None:
        results = self._func()
        if results:
            if not isinstance(results, Mapping):
                raise TypeError(
                    f"EvalHook's eval_function must return a dict of numbers (or None), got {type(results).__name__}"
                )
            flat = _flatten(results)
            for k, v in flat.items():
                try:
                    flat[k] = float(v)
                except (TypeError, ValueError) as e:
                    raise ValueError(
                        f"EvalHook's eval_function must return a nested dict of numbers; got {k!r}: {v!r}"
                    ) from e
            self.trainer.storage.put_scalars(**flat, smoothing_hint=False)
        dist.barrier()  # evaluation times differ between ranks: start the next step together

    def after_step(self) -> None:  # noqa: D102
        done = self.trainer.iter + 1
        if self._period > 0 and done % self._period == 0 and done != self.trainer.max_iter:
            self._do_eval()  # the last iteration's evaluation is after_train's

    def after_train(self) -> None:  # noqa: D102
        if self._eval_after_train and self.trainer.iter >= self.trainer.max_iter:  # only after a finished run
            self._do_eval()
