"""The parameter-scheduler base class: a chainable, windowed, resumable value schedule.

A scheduler changes one hyper-parameter (``lr``, ``momentum``, ``weight_decay``…) in every param group, one *unit*
per :meth:`ParamScheduler.step`: an epoch when ``by_epoch=True``, an optimizer update when ``by_update=True`` (one
accumulation window: nanoGPT's and Hugging Face's unit), else an iteration (one micro-batch, mmengine's unit); the
param-scheduler hook decides when to step. As in mmengine, each acts only inside its window ``begin <= global step <
end``, and values are computed in chainable form from the current value, so overlapping schedulers compose
multiplicatively (e.g. a linear warmup over iterations on top of a cosine decay over epochs).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

from trainwright.optim.scheduler.step_order import StepOrderWatch

INF = int(1e9)
"""The default ``end``: a window that never closes."""

_S = TypeVar("_S", bound="ParamScheduler")

#: Attributes that are not state: the optimizer, the misuse watch and the first-step shim.
_NOT_STATE = frozenset({"optimizer", "step", "_step_watch"})


@runtime_checkable
class OptimizerLike(Protocol):
    """Anything with torch-style ``param_groups``: an optimizer or an optimizer wrapper."""

    @property
    def param_groups(self) -> list[dict[str, Any]]: ...


class ParamScheduler:
    """Base class of all parameter schedulers; subclasses implement :meth:`_get_value`.

    Construction records ``initial_<param_name>`` in each param group (unless an earlier
    scheduler already did) and takes the first step, exactly as torch's schedulers do, so
    the optimizer holds the step-0 value right away.

    In a hand-written loop, the first :meth:`step` after construction warns (``UserWarning``)
    when no ``optimizer.step()`` ran before it, or when ``optimizer.step`` was replaced after
    the scheduler was built (see :mod:`~trainwright.optim.scheduler.step_order`); later steps
    pay nothing for this check. The Trainer turns it off (:meth:`disable_step_order_check`);
    metric-driven schedulers (``need_val_args``) never check.

    Args:
        optimizer: A ``torch.optim.Optimizer`` or any object with a ``param_groups``
            attribute (e.g. an ``OptimWrapper``).
        param_name: The param-group key to schedule, e.g. ``"lr"``.
        begin: First global step (in units of ``by_epoch``) at which the scheduler acts.
        end: First global step at which it stops acting (exclusive).
        last_step: Index of the last step taken inside the window, to resume without a
            state dict (the param groups must then already hold ``initial_<param_name>``).
            ``-1`` means a fresh start.
        by_epoch: Whether one :meth:`step` is one epoch (``True``) or one iteration.
        by_update: Count in optimizer updates: one :meth:`step` per closed accumulation
            window (``accumulative_counts`` iterations), so ``begin``/``end`` and the other
            lengths are numbers of updates. Implies ``by_epoch=False`` (mmengine configs keep
            ``by_epoch``'s default ``True``; a config that sets both is refused by the builder).

    Attributes:
        last_step: Steps taken inside the window, minus one (``-1`` before ``begin``).
        base_values: ``initial_<param_name>`` of each group when the scheduler was built.
    """

    epoch_valued_args: ClassVar[tuple[str, ...]] = ()
    """Constructor arguments counted in epochs; :meth:`build_iter_from_epoch` scales them."""

    need_val_args: ClassVar[bool] = False
    """Whether the scheduler is driven by validation metrics (``step(metrics)`` after each
    validation, as :class:`ReduceOnPlateauParamScheduler`); mmengine's attribute name."""

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
    ) -> None:
        if not hasattr(optimizer, "param_groups"):
            raise TypeError(
                f"{type(self).__name__} needs a torch.optim.Optimizer or an object with `param_groups` "
                f"(such as an OptimWrapper), got {type(optimizer).__name__}; pass the optimizer itself."
            )
        if end <= begin:
            raise ValueError(
                f"{type(self).__name__}: end ({end}) must be larger than begin ({begin}); fix the window so begin < "
                "end."
            )
        if not isinstance(last_step, int) or last_step < -1:
            raise ValueError(
                f"{type(self).__name__}: last_step must be an int >= -1 (-1 for a fresh start), got {last_step!r}."
            )
        self.optimizer = optimizer
        self.param_name = param_name
        self.begin = begin
        self.end = end
        self.by_update = bool(by_update)
        self.by_epoch = bool(by_epoch) and not self.by_update
        groups = optimizer.param_groups
        for i, group in enumerate(groups):
            if param_name not in group:
                raise KeyError(
                    f"{type(self).__name__}: param_groups[{i}] has no {param_name!r} (keys: "
                    f"{sorted(k for k in group if k != 'params')}); "
                    "schedule a key the optimizer has."
                )
        initial = f"initial_{param_name}"
        if last_step == -1:
            for group in groups:
                group.setdefault(initial, group[param_name])
        else:
            for i, group in enumerate(groups):
                if initial not in group:
                    raise KeyError(
                        f"{type(self).__name__}: resuming with last_step={last_step} needs "
                        f"param_groups[{i}][{initial!r}]; "
                        "load the optimizer state first, or resume with load_state_dict instead of last_step."
                    )
        self.base_values: list[float] = [group[initial] for group in groups]
        self.last_step = last_step
        # Global steps taken (the constructor's step is step 0); the window is checked on it.
        self._global_step = -1 if last_step == -1 else begin + last_step
        self._last_value: list[float] = []
        self.step()
        # Watch the optimizer's first step; the first `step` after this one checks the order, once.
        # A metric-driven scheduler has no step-0 value to skip (torch's ReduceLROnPlateau does not check either).
        self._step_watch = None if self.need_val_args else StepOrderWatch.attach(optimizer)
        if self._step_watch is not None:
            self.__dict__["step"] = self._first_step

    @property
    def unit(self) -> str:
        """What one :meth:`step` counts: ``"epoch"``, ``"update"`` (optimizer updates) or ``"iter"`` (iterations)."""
        return "epoch" if self.by_epoch else "update" if self.by_update else "iter"

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The scheduled optimizer's param groups."""
        return self.optimizer.param_groups

    def _current_values(self) -> list[float]:
        """The scheduled key's value in each param group right now."""
        return [group[self.param_name] for group in self.param_groups]

    def _get_value(self) -> list[float]:
        """Return the new value of each param group at ``self.last_step`` (chainable form)."""
        raise NotImplementedError

    def step(self) -> None:
        """Advance one unit (an epoch, an optimizer update or an iteration: :attr:`unit`) and update the groups."""
        self._global_step += 1
        if self.begin <= self._global_step < self.end:
            self.last_step += 1
            for group, value in zip(self.param_groups, self._get_value()):
                group[self.param_name] = value
        self._last_value = self._current_values()

    def _first_step(self, *args: Any, **kwargs: Any) -> None:
        """The first step after construction: warn about a misuse, then step (later calls skip this)."""
        watch = self._step_watch
        self.disable_step_order_check()
        problem = watch.problem(type(self).__name__) if watch is not None else None
        if problem is not None:
            warnings.warn(problem, UserWarning, stacklevel=2)
        self.step(*args, **kwargs)

    def disable_step_order_check(self) -> None:
        """Drop the first-step misuse check (the param-scheduler hook does, before training)."""
        self.__dict__.pop("step", None)
        watch, self._step_watch = self._step_watch, None
        if watch is not None:
            watch.close()

    def get_last_value(self) -> list[float]:
        """Return the value of each param group after the latest :meth:`step`."""
        return list(self._last_value)

    def state_dict(self) -> dict[str, Any]:
        """Return the scheduler's state: every attribute except the optimizer (plain types only)."""
        return {key: value for key, value in self.__dict__.items() if key not in _NOT_STATE}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict` (load the optimizer's state too).

        A state that has stepped past construction restores a scheduler in mid-schedule: its
        first-step misuse check is dropped (the order was the saved run's business), so every
        attribute equals the saved scheduler's, as in mmengine.
        """
        self.__dict__.update({k: v for k, v in state_dict.items() if k not in _NOT_STATE})
        if self._global_step > 0:
            self.disable_step_order_check()

    @classmethod
    def build_iter_from_epoch(
        cls: type[_S],
        *args: Any,
        begin: int = 0,
        end: int = INF,
        by_epoch: bool = True,
        epoch_length: int | None = None,
        **kwargs: Any,
    ) -> _S:
        """Build an iteration-based scheduler from an epoch-based configuration.

        ``begin``, ``end`` and the arguments named in :attr:`epoch_valued_args` (``T_max``,
        ``step_size``, ``milestones``, ``total_steps``…) are multiplied by ``epoch_length``, so
        the schedule has the same shape but updates every iteration instead of every epoch
        (every optimizer update with ``by_update=True`` in ``kwargs``: ``epoch_length`` is then
        the number of updates per epoch).

        Args:
            *args: Positional arguments of the scheduler (the optimizer first).
            begin: Window start, in epochs.
            end: Window end, in epochs.
            by_epoch: Must be ``True``: only an epoch-based configuration can be converted.
            epoch_length: Iterations per epoch (``len(train_dataloader)``).
            **kwargs: The scheduler's other keyword arguments.

        Raises:
            ValueError: ``by_epoch`` is false or ``epoch_length`` is not a positive integer.
        """
        if not by_epoch:
            raise ValueError(
                f"{cls.__name__}: convert_to_iter_based=True converts an epoch-based schedule, but by_epoch=False; "
                "drop convert_to_iter_based or set by_epoch=True."
            )
        if not isinstance(epoch_length, int) or isinstance(epoch_length, bool) or epoch_length <= 0:
            raise ValueError(
                f"{cls.__name__}: convert_to_iter_based=True needs epoch_length, the number of iterations per epoch, "
                f"as a positive int (got {epoch_length!r}); pass epoch_length=len(train_dataloader)."
            )
        for name in cls.epoch_valued_args:
            value = kwargs.get(name)
            if value is None:
                continue
            kwargs[name] = (
                [v * epoch_length for v in value] if isinstance(value, (list, tuple)) else value * epoch_length
            )
        begin = begin * epoch_length
        if end != INF:
            end = end * epoch_length
        return cls(*args, begin=begin, end=end, by_epoch=False, **kwargs)  # type: ignore[misc]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(param_name={self.param_name!r}, begin={self.begin}, end={self.end}, "
            f"by_epoch={self.by_epoch}, by_update={self.by_update}, last_step={self.last_step})"
        )


__all__ = ["INF", "OptimizerLike", "ParamScheduler"]
