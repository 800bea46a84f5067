"""Learning-rate schedulers: the generic schedulers with ``param_name="lr"``.

Same arguments as the generic ``*ParamScheduler`` classes minus ``param_name``, e.g.
``CosineAnnealingLR(optimizer, T_max=10, eta_min=1e-5)``.
"""

from __future__ import annotations

from typing import Any

from trainwright.optim.scheduler.base import OptimizerLike
from trainwright.optim.scheduler.one_cycle import OneCycleParamScheduler
from trainwright.optim.scheduler.param_scheduler import (
    ConstantParamScheduler,
    CosineAnnealingParamScheduler,
    ExponentialParamScheduler,
    LinearParamScheduler,
    MultiStepParamScheduler,
    PolyParamScheduler,
    StepParamScheduler,
)
from trainwright.registry import PARAM_SCHEDULERS


class LRSchedulerMixin:
    """Fix ``param_name`` to ``"lr"``; the remaining arguments go to the generic scheduler."""

    def __init__(self, optimizer: OptimizerLike, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, "lr", *args, **kwargs)  # type: ignore[call-arg]


@PARAM_SCHEDULERS.register()
class ConstantLR(LRSchedulerMixin, ConstantParamScheduler):
    """Learning rate times ``factor`` until the last step of the window; see :class:`ConstantParamScheduler`."""


@PARAM_SCHEDULERS.register()
class LinearLR(LRSchedulerMixin, LinearParamScheduler):
    """Learning rate scaled linearly from ``start_factor`` to ``end_factor`` (warmup); see :class:`LinearParamScheduler`."""


@PARAM_SCHEDULERS.register()
class StepLR(LRSchedulerMixin, StepParamScheduler):
    """Learning rate times ``gamma`` every ``step_size`` steps; see :class:`StepParamScheduler`."""


@PARAM_SCHEDULERS.register()
class MultiStepLR(LRSchedulerMixin, MultiStepParamScheduler):
    """Learning rate times ``gamma`` at each milestone; see :class:`MultiStepParamScheduler`."""


@PARAM_SCHEDULERS.register()
class ExponentialLR(LRSchedulerMixin, ExponentialParamScheduler):
    """Learning rate times ``gamma`` every step; see :class:`ExponentialParamScheduler`."""


@PARAM_SCHEDULERS.register()
class CosineAnnealingLR(LRSchedulerMixin, CosineAnnealingParamScheduler):
    """Cosine annealing of the learning rate to ``eta_min``; see :class:`CosineAnnealingParamScheduler`."""


@PARAM_SCHEDULERS.register()
class PolyLR(LRSchedulerMixin, PolyParamScheduler):
    """Polynomial decay of the learning rate to ``eta_min``; see :class:`PolyParamScheduler`."""


@PARAM_SCHEDULERS.register()
class OneCycleLR(LRSchedulerMixin, OneCycleParamScheduler):
    """The 1cycle learning-rate policy (no momentum cycling); see :class:`OneCycleParamScheduler`."""


__all__ = [
    "LRSchedulerMixin",
    "ConstantLR",
    "LinearLR",
    "StepLR",
    "MultiStepLR",
    "ExponentialLR",
    "CosineAnnealingLR",
    "PolyLR",
    "OneCycleLR",
]
