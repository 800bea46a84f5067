"""Generic parameter schedulers: schedule any param-group key named by ``param_name``.

Each ``_get_value`` is the *chainable* form: it derives the new value from the value now in
the param group (not from the base value), so schedulers stack multiplicatively. With only
one scheduler acting, each one equals the closed form given in its docstring, where ``t`` is
``last_step`` (steps since ``begin``) and ``base`` is the group's ``initial_<param_name>``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainwright.optim.scheduler.base import INF, OptimizerLike, ParamScheduler
from trainwright.registry import PARAM_SCHEDULERS


def _check_factor(owner: str, name: str, value: float, allow_zero: bool) -> None:
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value <= 1.0):
        bound = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(
            f"{owner}: {name} must be in {bound}, got {value}; e.g. use 1e-3 instead of 0 for a warmup from (almost) "
            "zero."
        )


@PARAM_SCHEDULERS.register()
class ConstantParamScheduler(ParamScheduler):
    """Multiply the value by ``factor`` from ``begin`` until the last step of the window.

    Closed form: ``base * factor`` for ``t < end - begin - 1``, then ``base`` (the value is
    restored on the last step inside the window, mmengine's convention).

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to schedule.
        factor: Multiplier in [0, 1] (0 is rejected: the value could not be restored).
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`.
    """

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        factor: float = 1.0 / 3,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
    ) -> None:
        _check_factor(type(self).__name__, "factor", factor, allow_zero=False)
        self.factor = factor
        self.total_iters = end - begin - 1
        super().__init__(
            optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch, by_update=by_update
        )

    def _get_value(self) -> list[float]:
        if self.last_step == 0:
            return [v * self.factor for v in self._current_values()]
        if self.last_step == self.total_iters:
            return [v / self.factor for v in self._current_values()]
        return self._current_values()


@PARAM_SCHEDULERS.register()
class LinearParamScheduler(ParamScheduler):
    """Scale the value by a factor moving linearly from ``start_factor`` to ``end_factor``.

    Closed form: ``base * (s + (e - s) * t / T)`` with ``T = end - begin - 1``; the end factor
    is reached on the last step inside the window. Typically used as a warmup.

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to schedule.
        start_factor: Factor at ``begin``, in (0, 1].
        end_factor: Factor at ``end - 1``, in [0, 1].
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`; ``end`` is required
            (a config without ``end`` gets the end of training from the builder, as in mmengine).
    """

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
    ) -> None:
        name = type(self).__name__
        _check_factor(name, "start_factor", start_factor, allow_zero=False)
        _check_factor(name, "end_factor", end_factor, allow_zero=True)
        if end == INF:
            raise ValueError(
                f"{name} changes the value over its window, so it needs end=... (e.g. end=50 with by_epoch=False for a "
                "50-iteration warmup). "
                "In a Trainer (or build_param_schedulers(..., max_epochs=/max_iters=)) a config without end ends with "
                "training, as in mmengine."
            )
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = end - begin - 1
        super().__init__(
            optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch, by_update=by_update
        )

    def _get_value(self) -> list[float]:
        if self.last_step == 0:
            first = self.start_factor if self.total_iters > 0 else self.end_factor
            return [v * first for v in self._current_values()]
        if self.last_step > self.total_iters:
            return self._current_values()
        delta = self.end_factor - self.start_factor
        ratio = 1.0 + delta / (self.total_iters * self.start_factor + (self.last_step - 1) * delta)
        return [v * ratio for v in self._current_values()]


@PARAM_SCHEDULERS.register()
class StepParamScheduler(ParamScheduler):
    """Multiply the value by ``gamma`` every ``step_size`` steps.

    Closed form: ``base * gamma ** (t // step_size)``.

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to schedule.
        step_size: Period of the decay, in steps (epochs when ``by_epoch``).
        gamma: Multiplicative decay.
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`.
    """

    epoch_valued_args = ("step_size",)

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        step_size: int,
        gamma: float = 0.1,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
    ) -> None:
        if step_size <= 0:
            raise ValueError(f"{type(self).__name__}: step_size must be a positive number of steps, got {step_size}.")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(
            optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch, by_update=by_update
        )

    def _get_value(self) -> list[float]:
        if self.last_step == 0 or self.last_step % self.step_size != 0:
            return self._current_values()
        return [v * self.gamma for v in self._current_values()]


@PARAM_SCHEDULERS.register()
class MultiStepParamScheduler(ParamScheduler):
    """Multiply the value by ``gamma`` at each milestone (twice for a repeated milestone).

    Closed form: ``base * gamma ** (number of milestones <= t)``.

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to schedule.
        milestones: Steps (relative to ``begin``) at which to decay.
        gamma: Multiplicative decay.
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`.
    """

    epoch_valued_args = ("milestones",)

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        milestones: Sequence[int],
        gamma: float = 0.1,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
    ) -> None:
        # A plain {step: count} dict (not a Counter) keeps the state loadable with weights_only=True.
        self.milestones: dict[int, int] = {}
        for m in milestones:
            self.milestones[int(m)] = self.milestones.get(int(m), 0) + 1
        self.gamma = gamma
        super().__init__(
            optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch, by_update=by_update
        )

    def _get_value(self) -> list[float]:
        count = self.milestones.get(self.last_step, 0)
        if count == 0:
            return self._current_values()
        return [v * self.gamma**count for v in self._current_values()]


@PARAM_SCHEDULERS.register()
class ExponentialParamScheduler(ParamScheduler):
    """Multiply the value by ``gamma`` every step.

    Closed form: ``base * gamma ** t``.

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to schedule.
        gamma: Multiplicative decay per step.
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`.
    """

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        gamma: float,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
    ) -> None:
        self.gamma = gamma
        super().__init__(
            optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch, by_update=by_update
        )

    def _get_value(self) -> list[float]:
        if self.last_step == 0:
            return self._current_values()
        return [v * self.gamma for v in self._current_values()]


@PARAM_SCHEDULERS.register()
class CosineAnnealingParamScheduler(ParamScheduler):
    """Anneal the value along a cosine from its base value to ``eta_min`` over ``T_max`` steps.

    Closed form: ``eta_min + (base - eta_min) * (1 + cos(pi * t / T_max)) / 2`` (periodic
    past ``T_max``, as in torch's ``CosineAnnealingLR``).

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to schedule.
        T_max: Steps of the half cosine; defaults to ``end - begin``.
        eta_min: Final value (default 0). Exclusive with ``eta_min_ratio``.
        eta_min_ratio: Final value as a fraction of each group's base value.
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`.

    Raises:
        ValueError: Neither ``T_max`` nor ``end`` is given, or both eta_min forms are.
    """

    epoch_valued_args = ("T_max",)

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        T_max: int | None = None,
        eta_min: float | None = None,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
        eta_min_ratio: float | None = None,
    ) -> None:
        name = type(self).__name__
        if eta_min is not None and eta_min_ratio is not None:
            raise ValueError(f"{name}: give eta_min or eta_min_ratio, not both (got {eta_min} and {eta_min_ratio}).")
        if T_max is None:
            if end == INF:
                unit = "optimizer updates" if by_update else "epochs" if by_epoch else "iterations"
                raise ValueError(
                    f"{name} needs the length of its cosine: pass T_max=... or end=... (in {unit}); "
                    "build_param_schedulers(..., max_epochs=/max_iters=) fills in end from the training length."
                )
            T_max = end - begin
        if T_max <= 0:
            raise ValueError(f"{name}: T_max must be a positive number of steps, got {T_max}.")
        self.T_max = T_max
        self.eta_min = 0.0 if eta_min is None and eta_min_ratio is None else eta_min
        self.eta_min_ratio = eta_min_ratio
        super().__init__(
            optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch, by_update=by_update
        )

    def _eta_min(self, base: float) -> float:
        return base * self.eta_min_ratio if self.eta_min_ratio is not None else float(self.eta_min or 0.0)

    def _get_value(self) -> list[float]:
        t, T = self.last_step, self.T_max
        if t == 0:
            return self._current_values()
        pairs = zip(self.base_values, self._current_values())
        if (t - 1 - T) % (2 * T) == 0:  # leaving the trough: the ratio form would divide by zero
            return [v + (b - self._eta_min(b)) * (1 - math.cos(math.pi / T)) / 2 for b, v in pairs]
        ratio = (1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
        return [ratio * (v - self._eta_min(b)) + self._eta_min(b) for b, v in pairs]


@PARAM_SCHEDULERS.register()
class PolyParamScheduler(ParamScheduler):
    """Decay the value polynomially to ``eta_min`` on the last step of the window.

    Closed form: ``eta_min + (base - eta_min) * (1 - t / T) ** power`` with ``T = end - begin - 1``.

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to schedule.
        eta_min: Final value.
        power: Exponent of the polynomial.
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`; ``end`` is required
            (a config without ``end`` gets the end of training from the builder, as in mmengine).
    """

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        eta_min: float = 0.0,
        power: float = 1.0,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
    ) -> None:
        if end == INF:
            raise ValueError(
                f"{type(self).__name__} decays over its window, so it needs end=... (the step at which the value "
                "reaches eta_min, plus one). "
                "In a Trainer (or build_param_schedulers(..., max_epochs=/max_iters=)) a config without end ends with "
                "training, as in mmengine."
            )
        self.eta_min = eta_min
        self.power = power
        self.total_iters = end - begin - 1
        super().__init__(
            optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch, by_update=by_update
        )

    def _get_value(self) -> list[float]:
        t = self.last_step
        if t == 0 or t > self.total_iters:
            return self._current_values()
        ratio = (1 - 1 / (self.total_iters - t + 1)) ** self.power
        return [(v - self.eta_min) * ratio + self.eta_min for v in self._current_values()]


__all__ = [
    "ConstantParamScheduler",
    "LinearParamScheduler",
    "StepParamScheduler",
    "MultiStepParamScheduler",
    "ExponentialParamScheduler",
    "CosineAnnealingParamScheduler",
    "PolyParamScheduler",
]
