"""Cosine annealing with warm restarts over given periods (mmengine's ``CosineRestartParamScheduler``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainwright.optim.scheduler.base import INF, OptimizerLike, ParamScheduler
from trainwright.registry import PARAM_SCHEDULERS


@PARAM_SCHEDULERS.register()
class CosineRestartParamScheduler(ParamScheduler):
    """Anneal along a cosine to ``eta_min`` in each period, restarting at ``base * restart_weight``.

    Closed form, with ``t`` steps since ``begin`` inside period ``i`` (which starts at
    ``c = periods[0] + ... + periods[i-1]``) and ``s = t - c``::

        eta_min + (base * restart_weights[i] - eta_min) * (1 + cos(pi * s / periods[i])) / 2

    Each period starts at its peak and ends one step before the trough (the next period
    restarts there). After the last period the value is held. Chainable inside a period: a
    restart sets the peak absolutely, as mmengine does.

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to schedule.
        periods: Length of each cosine cycle, in steps (epochs when ``by_epoch``).
        restart_weights: Peak of each cycle as a fraction of the base value, one per period
            (default: 1 for every period).
        eta_min: The floor of every cycle. Give exactly one of ``eta_min`` and ``eta_min_ratio``.
        eta_min_ratio: The floor as a fraction of each group's base value.
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`.

    Raises:
        ValueError: Both or neither of ``eta_min`` / ``eta_min_ratio``, an empty or
            non-positive period, or ``restart_weights`` of another length than ``periods``.
    """

    epoch_valued_args = ("periods",)

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        periods: Sequence[int],
        restart_weights: Sequence[float] | None = None,
        eta_min: float | None = None,
        eta_min_ratio: float | None = None,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        by_update: bool = False,
    ) -> None:
        name = type(self).__name__
        if (eta_min is None) == (eta_min_ratio is None):
            given = "both" if eta_min is not None else "neither"
            raise ValueError(
                f"{name}: give exactly one of eta_min (the floor of each cycle) and eta_min_ratio (the floor as a "
                "fraction "
                f"of the base value), got {given}; e.g. eta_min=1e-5 or eta_min_ratio=0.01."
            )
        if (
            isinstance(periods, (int, float))
            or not periods
            or any(not isinstance(p, int) or isinstance(p, bool) or p <= 0 for p in periods)
        ):
            raise ValueError(
                f"{name}: periods must be a non-empty list of positive ints (steps per cosine cycle), got {periods!r}; "
                "e.g. periods=[10, 20]."
            )
        weights = [1.0] * len(periods) if restart_weights is None else [float(w) for w in restart_weights]
        if len(weights) != len(periods):
            raise ValueError(
                f"{name}: restart_weights has {len(weights)} values but periods has {len(periods)}; give one weight "
                "per period "
                f"(e.g. restart_weights={[1.0] * len(periods)}) or leave restart_weights out for 1 everywhere."
            )
        self.periods = [int(p) for p in periods]
        self.restart_weights = weights
        self.eta_min = None if eta_min is None else float(eta_min)
        self.eta_min_ratio = None if eta_min_ratio is None else float(eta_min_ratio)
        self.cumulative_periods = [sum(self.periods[: i + 1]) for i in range(len(self.periods))]
        super().__init__(
            optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch, by_update=by_update
        )

    def _period(self, t: int) -> int | None:
        """The index of the period holding step ``t``, or None past the last one."""
        for i, stop in enumerate(self.cumulative_periods):
            if t < stop:
                return i
        return None

    def _floor(self, base: float) -> float:
        return base * self.eta_min_ratio if self.eta_min_ratio is not None else float(self.eta_min or 0.0)

    def _get_value(self) -> list[float]:
        t = self.last_step
        i = self._period(t)
        if i is None:
            return self._current_values()
        s = t - (self.cumulative_periods[i - 1] if i else 0)
        if s == 0:  # a restart: the peak of this cycle
            return [b * self.restart_weights[i] for b in self.base_values]
        period = self.periods[i]
        ratio = (1 + math.cos(math.pi * s / period)) / (1 + math.cos(math.pi * (s - 1) / period))
        return [ratio * (v - self._floor(b)) + self._floor(b) for b, v in zip(self.base_values, self._current_values())]


__all__ = ["CosineRestartParamScheduler"]
