"""The 1cycle schedule (Smith & Topin, "Super-Convergence"), as in torch's ``OneCycleLR``.

Unlike the other schedulers it is not chainable: it computes absolute values from the
``initial_/max_/min_<param_name>`` entries it writes into each param group.
``OneCycleLR(cycle_momentum=True)`` also cycles the momentum inversely (``max_momentum`` →
``base_momentum`` while the learning rate rises, and back), from ``max_momentum`` /
``base_momentum`` entries, as torch's ``OneCycleLR`` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainwright.optim.scheduler.base import INF, OptimizerLike, ParamScheduler
from trainwright.registry import PARAM_SCHEDULERS


@PARAM_SCHEDULERS.register()
class OneCycleParamScheduler(ParamScheduler):
    """The 1cycle policy: warm up from ``eta_max / div_factor`` to ``eta_max``, then anneal.

    Matches ``torch.optim.lr_scheduler.OneCycleLR`` (without momentum cycling) for steps
    ``0..total_steps``; past ``total_steps`` the value is held instead of raising. Not
    chainable: it sets ``initial_/max_/min_<param_name>`` in the groups and computes absolute
    values from them.

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to schedule.
        eta_max: Peak value, one for all groups or one per group.
        total_steps: Steps in the cycle; defaults to ``end - begin``.
        pct_start: Fraction of the cycle spent increasing the value.
        anneal_strategy: ``"cos"`` or ``"linear"``.
        div_factor: Start value is ``eta_max / div_factor``.
        final_div_factor: Final value is the start value ``/ final_div_factor``.
        three_phase: Anneal back to the start value, then down to the final value (paper
            version) instead of the two-phase fastai version.
        begin, end, last_step, by_epoch, by_update: See :class:`ParamScheduler`.
    """

    epoch_valued_args = ("total_steps",)

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
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
    ) -> None:
        name = type(self).__name__
        if total_steps is None:
            if end == INF:
                raise ValueError(f"{name} needs the cycle length: pass total_steps=... or end=....")
            total_steps = end - begin
        if not isinstance(total_steps, int) or total_steps <= 0:
            raise ValueError(f"{name}: total_steps must be a positive int, got {total_steps!r}.")
        if not 0.0 <= pct_start <= 1.0:
            raise ValueError(f"{name}: pct_start must be a fraction in [0, 1], got {pct_start}.")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"{name}: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}.")
        self.total_steps = total_steps
        self.anneal_strategy = anneal_strategy
        up_end = float(pct_start * total_steps) - 1
        # Phases as (end_step, start key, end key); plain tuples of str/float keep the state loadable.
        if three_phase:
            self.phases: list[tuple[float, str, str]] = [
                (up_end, "initial", "max"),
                (float(2 * pct_start * total_steps) - 2, "max", "initial"),
                (total_steps - 1, "initial", "min"),
            ]
            # The inverse cycle a momentum follows (used by OneCycleLR(cycle_momentum=True)).
            self.momentum_phases: list[tuple[float, str, str]] = [
                (up_end, "max", "base"),
                (float(2 * pct_start * total_steps) - 2, "base", "max"),
                (total_steps - 1, "max", "max"),
            ]
        else:
            self.phases = [(up_end, "initial", "max"), (total_steps - 1, "max", "min")]
            self.momentum_phases = [(up_end, "max", "base"), (total_steps - 1, "base", "max")]
        groups = optimizer.param_groups
        if isinstance(eta_max, (list, tuple)):
            if len(eta_max) != len(groups):
                raise ValueError(
                    f"{name}: eta_max has {len(eta_max)} values but the optimizer has {len(groups)} param groups; give "
                    "one per group or a single float."
                )
            peaks = [float(v) for v in eta_max]
        else:
            peaks = [float(eta_max)] * len(groups)  # type: ignore[arg-type]
        if last_step == -1:
            for group, peak in zip(groups, peaks):
                group[f"initial_{param_name}"] = peak / div_factor
                group[f"max_{param_name}"] = peak
                group[f"min_{param_name}"] = peak / div_factor / final_div_factor
        super().__init__(
            optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch, by_update=by_update
        )

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _get_value(self) -> list[float]:
        if self.last_step > self.total_steps:
            return self._current_values()
        return self._cycle_values(self.param_name, self.phases)

    def _cycle_values(self, key: str, phases: list[tuple[float, str, str]]) -> list[float]:
        """The value of ``key`` in each group at ``last_step`` along ``phases`` (from ``<lo>_<key>`` to
        ``<hi>_<key>``)."""
        t = self.last_step
        values: list[float] = []
        for group in self.param_groups:
            start_step = 0.0
            for i, (end_step, lo, hi) in enumerate(phases):
                if t <= end_step or i == len(phases) - 1:
                    pct = (t - start_step) / (end_step - start_step)
                    values.append(self._anneal(group[f"{lo}_{key}"], group[f"{hi}_{key}"], pct))
                    break
                start_step = end_step
        return values


__all__ = ["OneCycleParamScheduler"]
