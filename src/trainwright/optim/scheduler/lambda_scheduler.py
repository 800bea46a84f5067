"""Schedules written as a function of the step: torch's ``LambdaLR`` as a windowed, resumable scheduler.

``dict(type="LambdaLR", lr_lambda=get_lr_factor, by_update=True)`` in a Python config (or
``LambdaLR(optimizer, fn)`` built by hand) sets the learning rate to ``base * fn(t)``, ``t``
counting the steps since ``begin`` in the scheduler's unit, exactly as torch's ``LambdaLR``
computes it. The functions are code, so a checkpoint never holds them (as torch's
``state_dict`` skips plain functions): a resumed run uses the functions it is given and
continues from the saved step.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

from trainwright.optim.scheduler.base import INF, OptimizerLike, ParamScheduler
from trainwright.registry import PARAM_SCHEDULERS

Factor = Callable[[int], float]


@PARAM_SCHEDULERS.register()
class LambdaParamScheduler(ParamScheduler):
    """Set the value to ``base * factor_lambda(t)``: a schedule as any function of the step.

    Not chainable (as torch's ``LambdaLR``): the value is computed from the base value, so
    a scheduler listed before it on the same key inside its window is overwritten, and one
    listed after it scales its result.

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to schedule.
        factor_lambda: ``t -> factor`` (``t`` = steps since ``begin``, from 0), or one such
            function per param group.
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`.

    Raises:
        TypeError: A factor that is not callable, or a function that returns no number.
        ValueError: A list of functions whose length is not the number of param groups.
    """

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        factor_lambda: Factor | Sequence[Factor],
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
    ) -> None:
        name = type(self).__name__
        groups = getattr(optimizer, "param_groups", None) or []
        if isinstance(factor_lambda, (list, tuple)):
            if len(factor_lambda) != len(groups):
                raise ValueError(
                    f"{name}: got {len(factor_lambda)} functions for {len(groups)} param groups; give one function, or "
                    "one per group."
                )
            fns = list(factor_lambda)
        else:
            fns = [factor_lambda] * len(groups)  # type: ignore[list-item]
        for fn in fns:
            if not callable(fn):
                raise TypeError(
                    f"{name}: the schedule must be a function of the step (t -> factor), got {type(fn).__name__}: "
                    f"{fn!r}."
                )
        self.factor_lambdas: list[Factor] = fns
        super().__init__(
            optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch, by_update=by_update
        )

    def _get_value(self) -> list[float]:
        values: list[float] = []
        for base, fn in zip(self.base_values, self.factor_lambdas):
            factor = fn(self.last_step)
            if not isinstance(factor, numbers.Real) or isinstance(factor, bool):
                raise TypeError(
                    f"{type(self).__name__}: the schedule function returned {type(factor).__name__} {factor!r} at step "
                    f"{self.last_step}; "
                    "it must return a number (the factor applied to the base value)."
                )
            values.append(base * factor)
        return values

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state without its functions (code is never saved; a resumed run is given them again)."""
        state = super().state_dict()
        state.pop("factor_lambdas", None)
        return state


@PARAM_SCHEDULERS.register()
class LambdaLR(LambdaParamScheduler):
    """Learning rate ``base_lr * lr_lambda(t)``, as torch's ``LambdaLR``; see :class:`LambdaParamScheduler`.

    ``dict(type="LambdaLR", lr_lambda=fn)`` in a Python config. For nanoGPT's
    ``get_lr(it)``, which counts optimizer updates, add ``by_update=True`` and divide by
    the peak learning rate: ``lr_lambda=lambda it: get_lr(it) / learning_rate``.

    Args:
        optimizer: Optimizer or optimizer wrapper.
        lr_lambda: ``t -> factor``, or one such function per param group.
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`.
    """

    def __init__(
        self,
        optimizer: OptimizerLike,
        lr_lambda: Factor | Sequence[Factor],
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
    ) -> None:
        super().__init__(
            optimizer,
            "lr",
            lr_lambda,
            begin=begin,
            end=end,
            last_step=last_step,
            by_epoch=by_epoch,
            by_update=by_update,
        )


__all__ = ["LambdaParamScheduler", "LambdaLR"]
