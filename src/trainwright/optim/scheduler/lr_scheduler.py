"""Learning-rate schedulers: the generic schedulers with ``param_name="lr"``.

Same arguments as the generic ``*ParamScheduler`` classes minus ``param_name``, e.g.
``CosineAnnealingLR(optimizer, T_max=10, eta_min=1e-5)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainwright.optim.scheduler.base import INF, OptimizerLike
from trainwright.optim.scheduler.cosine_restart import CosineRestartParamScheduler
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
from trainwright.optim.scheduler.plateau import ReduceOnPlateauParamScheduler
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
    """Learning rate scaled linearly from ``start_factor`` to ``end_factor`` (warmup); see
    :class:`LinearParamScheduler`."""


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
    """The 1cycle learning-rate policy, optionally cycling the momentum; see :class:`OneCycleParamScheduler`.

    With ``cycle_momentum=True`` the momentum (``betas[0]`` for Adam-style optimizers) goes
    from ``max_momentum`` down to ``base_momentum`` while the learning rate rises, and back
    up while it falls (three-phase: back up in the second phase, held in the third), as in
    torch's ``OneCycleLR``. Off by default, as in mmengine.

    Args:
        optimizer: Optimizer or optimizer wrapper.
        eta_max, total_steps, pct_start, anneal_strategy, div_factor, final_div_factor,
            three_phase, begin, end, last_step, by_epoch, by_update: See :class:`OneCycleParamScheduler`.
        cycle_momentum: Cycle the momentum inversely to the learning rate.
        base_momentum: Lowest momentum (at the learning-rate peak), one or one per group.
        max_momentum: Highest momentum (at the start and the end), one or one per group.

    Raises:
        ValueError: ``cycle_momentum`` on an optimizer with neither ``momentum`` nor ``betas``,
            or a per-group list of the wrong length.
    """

    def __init__(
        self,
        optimizer: OptimizerLike,
        eta_max: float | Sequence[float] = 0.0,
        total_steps: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
        cycle_momentum: bool = False,
        base_momentum: float | Sequence[float] = 0.85,
        max_momentum: float | Sequence[float] = 0.95,
    ) -> None:
        self.cycle_momentum = bool(cycle_momentum)
        self.use_betas = False
        if self.cycle_momentum:
            self._prepare_momentum(optimizer, base_momentum, max_momentum, fresh=last_step == -1)
        super().__init__(
            optimizer,
            eta_max=eta_max,
            total_steps=total_steps,
            pct_start=pct_start,
            anneal_strategy=anneal_strategy,
            div_factor=div_factor,
            final_div_factor=final_div_factor,
            three_phase=three_phase,
            begin=begin,
            end=end,
            last_step=last_step,
            by_epoch=by_epoch,
            by_update=by_update,
        )

    def _prepare_momentum(
        self, optimizer: OptimizerLike, base: float | Sequence[float], peak: float | Sequence[float], fresh: bool
    ) -> None:
        name = type(self).__name__
        groups = getattr(optimizer, "param_groups", None) or []
        if groups and "betas" in groups[0]:
            self.use_betas = True
        elif groups and "momentum" not in groups[0]:
            raise ValueError(
                f"{name}: cycle_momentum=True but the optimizer has neither `momentum` nor `betas` in its param groups "
                f"(keys: {sorted(k for k in groups[0] if k != 'params')}); use an optimizer with momentum or set "
                "cycle_momentum=False."
            )
        per_group: list[list[float]] = []
        for arg, value in (("base_momentum", base), ("max_momentum", peak)):
            if isinstance(value, (list, tuple)):
                if len(value) != len(groups):
                    raise ValueError(
                        f"{name}: {arg} has {len(value)} values but the optimizer has {len(groups)} param groups; give "
                        "one per group or a single float."
                    )
                per_group.append([float(v) for v in value])
            else:
                per_group.append([float(value)] * len(groups))  # type: ignore[arg-type]
        if not fresh:
            for i, group in enumerate(groups):
                if "max_momentum" not in group or "base_momentum" not in group:
                    raise KeyError(
                        f"{name}: resuming with last_step needs param_groups[{i}]['max_momentum'] and "
                        "['base_momentum']; "
                        "load the optimizer state first, or resume with load_state_dict instead of last_step."
                    )
            return
        for group, low, high in zip(groups, *per_group):
            group["base_momentum"] = low
            group["max_momentum"] = high
            self._set_momentum(group, high)

    def _set_momentum(self, group: dict[str, Any], value: float) -> None:
        if self.use_betas:
            group["betas"] = (value, *tuple(group["betas"])[1:])
        else:
            group["momentum"] = value

    def step(self) -> None:
        """Advance one unit; with ``cycle_momentum`` set the momentum of the same step too."""
        before = self.last_step
        super().step()
        if self.cycle_momentum and self.last_step != before and self.last_step <= self.total_steps:
            for group, value in zip(self.param_groups, self._cycle_values("momentum", self.momentum_phases)):
                self._set_momentum(group, value)


@PARAM_SCHEDULERS.register()
class CosineRestartLR(LRSchedulerMixin, CosineRestartParamScheduler):
    """Cosine annealing of the learning rate with warm restarts; see :class:`CosineRestartParamScheduler`."""


@PARAM_SCHEDULERS.register()
class ReduceOnPlateauLR(LRSchedulerMixin, ReduceOnPlateauParamScheduler):
    """Reduce the learning rate when a validation metric stops improving; see :class:`ReduceOnPlateauParamScheduler`."""


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
    "CosineRestartLR",
    "ReduceOnPlateauLR",
]
