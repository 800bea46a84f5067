"""Momentum schedulers: the generic schedulers applied to the optimizer's momentum.

"Momentum" is the ``momentum`` key for optimizers that have one (SGD, RMSprop) and
``betas[0]`` for those with ``betas`` (Adam, AdamW, NAdam, RAdam, Adamax). For the latter a
``momentum`` key mirroring ``betas[0]`` is added to each param group: the schedule runs on
it and every step writes it back into ``betas``, leaving ``betas[1]`` untouched.
"""

from __future__ import annotations

from typing import Any

from trainwright.optim.scheduler.base import OptimizerLike
from trainwright.optim.scheduler.cosine_restart import CosineRestartParamScheduler
from trainwright.optim.scheduler.param_scheduler import (
    ConstantParamScheduler,
    CosineAnnealingParamScheduler,
    ExponentialParamScheduler,
    LinearParamScheduler,
    MultiStepParamScheduler,
    PolyParamScheduler,
    StepParamScheduler,
)
from trainwright.optim.scheduler.plateau import ReduceOnPlateauParamScheduler
from trainwright.registry import PARAM_SCHEDULERS


class MomentumSchedulerMixin:
    """Fix ``param_name`` to ``"momentum"`` and keep Adam-style ``betas[0]`` in sync with it."""

    use_betas: bool
    param_groups: list[dict[str, Any]]

    def __init__(self, optimizer: OptimizerLike, *args: Any, **kwargs: Any) -> None:
        groups = getattr(optimizer, "param_groups", None)
        self.use_betas = False
        if not groups:
            pass  # the base class explains what an optimizer must look like
        # `betas` first: a previous momentum scheduler may already have added a `momentum` key.
        elif "betas" in groups[0]:
            self.use_betas = True
            for group in groups:
                group["momentum"] = group["betas"][0]
        elif "momentum" not in groups[0]:
            raise ValueError(
                f"{type(self).__name__}: the optimizer has neither `momentum` nor `betas` in its param groups "
                f"(keys: {sorted(k for k in groups[0] if k != 'params')}); use an optimizer with momentum "
                "(SGD, RMSprop, Adam…) or drop the momentum scheduler."
            )
        super().__init__(optimizer, "momentum", *args, **kwargs)  # type: ignore[call-arg]

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the schedule (with its arguments, e.g. metrics), then copy ``momentum`` into ``betas[0]`` for
        Adam-style optimizers."""
        super().step(*args, **kwargs)  # type: ignore[misc]
        if self.use_betas:
            for group in self.param_groups:
                group["betas"] = (group["momentum"], *tuple(group["betas"])[1:])


@PARAM_SCHEDULERS.register()
class ConstantMomentum(MomentumSchedulerMixin, ConstantParamScheduler):
    """Momentum times ``factor`` until the last step of the window; see :class:`ConstantParamScheduler`."""


@PARAM_SCHEDULERS.register()
class LinearMomentum(MomentumSchedulerMixin, LinearParamScheduler):
    """Momentum scaled linearly from ``start_factor`` to ``end_factor``; see :class:`LinearParamScheduler`."""


@PARAM_SCHEDULERS.register()
class StepMomentum(MomentumSchedulerMixin, StepParamScheduler):
    """Momentum times ``gamma`` every ``step_size`` steps; see :class:`StepParamScheduler`."""


@PARAM_SCHEDULERS.register()
class MultiStepMomentum(MomentumSchedulerMixin, MultiStepParamScheduler):
    """Momentum times ``gamma`` at each milestone; see :class:`MultiStepParamScheduler`."""


@PARAM_SCHEDULERS.register()
class ExponentialMomentum(MomentumSchedulerMixin, ExponentialParamScheduler):
    """Momentum times ``gamma`` every step; see :class:`ExponentialParamScheduler`."""


@PARAM_SCHEDULERS.register()
class CosineAnnealingMomentum(MomentumSchedulerMixin, CosineAnnealingParamScheduler):
    """Cosine annealing of the momentum to ``eta_min``; see :class:`CosineAnnealingParamScheduler`."""


@PARAM_SCHEDULERS.register()
class PolyMomentum(MomentumSchedulerMixin, PolyParamScheduler):
    """Polynomial decay of the momentum to ``eta_min``; see :class:`PolyParamScheduler`."""


@PARAM_SCHEDULERS.register()
class CosineRestartMomentum(MomentumSchedulerMixin, CosineRestartParamScheduler):
    """Cosine annealing of the momentum with warm restarts; see :class:`CosineRestartParamScheduler`."""


@PARAM_SCHEDULERS.register()
class ReduceOnPlateauMomentum(MomentumSchedulerMixin, ReduceOnPlateauParamScheduler):
    """Reduce the momentum when a validation metric stops improving; see :class:`ReduceOnPlateauParamScheduler`."""


__all__ = [
    "MomentumSchedulerMixin",
    "ConstantMomentum",
    "LinearMomentum",
    "StepMomentum",
    "MultiStepMomentum",
    "ExponentialMomentum",
    "CosineAnnealingMomentum",
    "PolyMomentum",
    "CosineRestartMomentum",
    "ReduceOnPlateauMomentum",
]
