"""Reduce a parameter when a validation metric stops improving (torch's ``ReduceLROnPlateau``).

Unlike the other schedulers it is driven by metrics: ``step(metrics)`` after each validation
compares the monitored value with the best so far; ``step()`` without metrics only counts a
unit (an epoch, or an iteration when ``by_epoch=False``) for the ``begin``/``end`` window.
The param-scheduler hook does both during training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from trainwright.logging.metric_key import VAL_PREFIX, metric_key
from trainwright.optim.scheduler.base import INF, OptimizerLike, ParamScheduler
from trainwright.registry import PARAM_SCHEDULERS, did_you_mean


@PARAM_SCHEDULERS.register()
class ReduceOnPlateauParamScheduler(ParamScheduler):
    """Multiply the value by ``factor`` once ``monitor`` has not improved for ``patience`` validations.

    After each validation, ``monitor`` improves when it beats the best value so far by the
    threshold: with ``rule="less"``, ``value < best * (1 - threshold)`` (``threshold_rule="rel"``)
    or ``value < best - threshold`` (``"abs"``); with ``rule="greater"``, ``value > best *
    (1 + threshold)`` or ``value > best + threshold``. More than ``patience`` validations in a
    row without improvement multiply each group's value by ``factor`` (not below
    ``min_value``; a change smaller than ``eps`` is skipped), then ``cooldown`` validations
    are ignored. Identical to ``torch.optim.lr_scheduler.ReduceLROnPlateau`` (``rule`` is its
    ``mode``: ``"less"`` = ``"min"``).

    Only validations inside the window count: ``begin <= s < end`` where ``s`` is the number
    of units trained so far (epochs when ``by_epoch``, else iterations).

    Args:
        optimizer: Optimizer or optimizer wrapper.
        param_name: The param-group key to reduce.
        monitor: The metric key, as the validation loop reports it (``"val/loss"``,
            ``"val/acc"``); a key without the ``val/`` prefix (mmengine's spelling, e.g.
            ``"loss"``) is found as ``val/<monitor>`` too.
        rule: ``"less"`` (lower is better) or ``"greater"``.
        factor: Multiplier applied on a plateau, in [0, 1).
        patience: Validations without improvement tolerated before reducing (>= 0).
        threshold: Smallest change that counts as an improvement (>= 0).
        threshold_rule: ``"rel"`` (threshold is a fraction of the best value) or ``"abs"``.
        cooldown: Validations to ignore after a reduction (>= 0).
        min_value: Lower bound of the value, one for all groups or one per group.
        eps: A reduction smaller than this is not applied.
        begin, end, last_step, by_epoch: See :class:`ParamScheduler`; ``last_step`` counts
            validations inside the window.

    Raises:
        ValueError: An argument out of its range, or ``min_value`` of the wrong length.
        KeyError: (on ``step(metrics)``) ``monitor`` is not among the metrics.
    """

    need_val_args: ClassVar[bool] = True

    def __init__(
        self,
        optimizer: OptimizerLike,
        param_name: str,
        monitor: str = "loss",
        rule: str = "less",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_rule: str = "rel",
        cooldown: int = 0,
        min_value: float | Sequence[float] = 0.0,
        eps: float = 1e-8,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
    ) -> None:
        name = type(self).__name__
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"{name}: monitor must be a metric key such as 'val/loss' or 'val/acc', got {monitor!r}.")
        if rule not in ("less", "greater"):
            raise ValueError(
                f"{name}: rule must be 'less' (lower is better, e.g. a loss) or 'greater' (e.g. an accuracy), got "
                f"{rule!r}."
            )
        if threshold_rule not in ("rel", "abs"):
            raise ValueError(
                f"{name}: threshold_rule must be 'rel' (a fraction of the best value) or 'abs', got {threshold_rule!r}."
            )
        if not 0.0 <= factor < 1.0:
            raise ValueError(
                f"{name}: factor must be in [0, 1) (the value is multiplied by it on a plateau), got {factor}; e.g. "
                "factor=0.1."
            )
        for arg, value in (("patience", patience), ("cooldown", cooldown)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: {arg} must be an int >= 0 (a number of validations), got {value!r}.")
        if threshold < 0 or eps < 0:
            raise ValueError(f"{name}: threshold and eps must be >= 0, got threshold={threshold}, eps={eps}.")
        n_groups = len(getattr(optimizer, "param_groups", []))
        if isinstance(min_value, (list, tuple)):
            if len(min_value) != n_groups:
                raise ValueError(
                    f"{name}: min_value has {len(min_value)} values but the optimizer has {n_groups} param groups; "
                    "give one per group or a single float."
                )
            self.min_values = [float(v) for v in min_value]
        else:
            self.min_values = [float(min_value)] * n_groups  # type: ignore[arg-type]
        self.monitor = monitor
        self.rule = rule
        self.factor = float(factor)
        self.patience = patience
        self.threshold = float(threshold)
        self.threshold_rule = threshold_rule
        self.cooldown = cooldown
        self.eps = float(eps)
        self.best = math.inf if rule == "less" else -math.inf
        self.num_bad_epochs = 0
        self.cooldown_counter = 0
        # The base constructor's step (no metrics) counts unit 0, as mmengine's scheduler starts.
        super().__init__(optimizer, param_name, begin=begin, end=end, last_step=last_step, by_epoch=by_epoch)
        self._last_value = self._current_values()

    def step(self, metrics: Mapping[str, Any] | None = None) -> None:  # type: ignore[override]
        """Without ``metrics``: count one unit. With them (after a validation): compare and maybe reduce.

        Args:
            metrics: The validation metrics, a mapping key -> number.

        Raises:
            TypeError: ``metrics`` is not a mapping.
            KeyError: ``monitor`` is not among ``metrics`` (the message lists them).
        """
        if metrics is None:
            self._global_step += 1
            return
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"{type(self).__name__}.step(metrics) takes the validation metrics as a dict (e.g. {{'val/loss': "
                f"0.3}}), "
                f"got {type(metrics).__name__}; pass the dict the validation returned."
            )
        if not self.begin <= self._global_step < self.end:
            return
        value = self._monitored(metrics)
        self.last_step += 1
        if self._is_better(value):
            self.best = value
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad validations during the cooldown do not count
        if self.num_bad_epochs > self.patience:
            for group, new in zip(self.param_groups, self._get_value()):
                if float(group[self.param_name]) - new > self.eps:
                    group[self.param_name] = new
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_value = self._current_values()

    def _get_value(self) -> list[float]:
        """The reduced value of each group: ``max(value * factor, min_value)``."""
        return [max(float(v) * self.factor, low) for v, low in zip(self._current_values(), self.min_values)]

    def _monitored(self, metrics: Mapping[str, Any]) -> float:
        key = metric_key(self.monitor, metrics)
        if key is not None:
            return float(metrics[key])
        name = type(self).__name__
        if not metrics:
            raise KeyError(
                f"{name}: monitor {self.monitor!r} is not among the validation metrics: the validation reported none. "
                "Give the Trainer a val_evaluator (e.g. tw.evaluation.Accuracy()) whose metrics include it."
            )
        raise KeyError(
            f"{name}: monitor {self.monitor!r} is not among the validation metrics {sorted(metrics)}."
            f"{did_you_mean(self.monitor, list(metrics))} Set monitor to one of them (with rule='less' for a loss, "
            "'greater' for an accuracy)."
        )

    def _is_better(self, value: float) -> bool:
        best, th = self.best, self.threshold
        if self.rule == "less":
            return value < (best * (1.0 - th) if self.threshold_rule == "rel" else best - th)
        return value > (best * (1.0 + th) if self.threshold_rule == "rel" else best + th)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(param_name={self.param_name!r}, monitor={self.monitor!r}, rule={self.rule!r}, "
            f"factor={self.factor}, patience={self.patience}, best={self.best}, num_bad_epochs={self.num_bad_epochs})"
        )


__all__ = ["ReduceOnPlateauParamScheduler", "VAL_PREFIX", "metric_key"]
