"""EarlyStoppingHook: end training when a validation metric stops improving."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from trainwright.hooks.checkpoint import DEFAULT_GREATER_KEYS, DEFAULT_LESS_KEYS, infer_rule
from trainwright.hooks.hook import Hook
from trainwright.logging.metric_key import metric_key
from trainwright.registry import HOOKS, did_you_mean

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register
class EarlyStoppingHook(Hook):
    """Stop training after ``patience`` validations without improvement of ``monitor``.

    After each validation the monitored value is compared with the best so far. It
    improves when it beats the best by more than ``min_delta`` (``rule="greater"``:
    ``value > best + min_delta``; ``"less"``: ``value < best - min_delta``); otherwise the
    validation counts as bad, and after ``patience`` bad validations in a row the hook asks the
    train loop's run control to stop (``control.request_stop(reason)``: training ends normally
    after the current iteration) and logs why; a validation outside ``train()`` only logs it.
    Training also stops at once when the value is NaN/Inf (``check_finite``) or
    reaches ``stopping_threshold``.

    The best value and the count of bad validations are checkpointed, so a resumed run
    stops where the uninterrupted one would have.

    Args:
        monitor: Metric key as the validation loop reports it, e.g. ``"val/acc"``; an mmengine
            key without the ``val/`` prefix (``"accuracy/top1"``) is found as ``val/<monitor>``
            too, as ``ReduceOnPlateau`` does.
        rule: ``"greater"`` or ``"less"`` is better; ``None`` infers it from the name by
            mmengine's keys, case-insensitively (``acc``, ``top``, ``auc``, ``precision``,
            ``mAP``... → ``"greater"``; ``loss`` → ``"less"``); a name matching none (``"recall"``)
            needs an explicit ``rule`` (a ``ValueError`` at construction, as in mmengine).
        min_delta: Smallest change that counts as an improvement (>= 0).
        patience: Bad validations in a row to tolerate before stopping (>= 1).
        strict: Raise if ``monitor`` is missing from the metrics (otherwise warn and skip).
        check_finite: Stop when the monitored value is NaN or infinite.
        stopping_threshold: Stop as soon as the value reaches this (``>=`` for
            ``"greater"``, ``<=`` for ``"less"``).
    """

    # after EMAHook / logging (so "val/raw/..." keys exist), before the checkpoint hook
    # (so a checkpoint saved after validation holds this validation's counters)
    priority = "LOW"

    def __init__(
        self,
        monitor: str,
        rule: str | None = None,
        min_delta: float = 0.0,
        patience: int = 5,
        strict: bool = False,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"EarlyStoppingHook monitor must be a metric key such as 'val/acc', got {monitor!r}")
        if rule is None:
            try:
                rule = infer_rule(monitor)
            except ValueError:
                raise ValueError(
                    f"EarlyStoppingHook cannot tell whether a higher or a lower {monitor!r} is better: it matches none "
                    "of mmengine's "
                    f"greater keys {list(DEFAULT_GREATER_KEYS)} nor less keys {list(DEFAULT_LESS_KEYS)}. Pass "
                    "rule='greater' or rule='less'"
                ) from None
        if rule not in ("greater", "less"):
            raise ValueError(
                f"EarlyStoppingHook rule must be 'greater', 'less' or None (inferred from the name), got {rule!r}"
            )
        if min_delta < 0:
            raise ValueError(
                f"EarlyStoppingHook min_delta must be >= 0 (the direction comes from `rule`), got {min_delta}"
            )
        if not isinstance(patience, int) or patience < 1:
            raise ValueError(f"EarlyStoppingHook patience must be an int >= 1, got {patience!r}")
        self.monitor = monitor
        self.rule = rule
        self.min_delta = float(min_delta)
        self.patience = patience
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.best_score = -math.inf if rule == "greater" else math.inf
        self._training = False  # between before_train and the run's end: a stop goes to the train loop's control
        self.wait_count = 0

    @override
    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:
        """Compare the monitored value with the best; request a stop when it is time (None: a stop request cut the
        pass)."""
        if metrics is None:
            return
        metrics = metrics or {}
        key = metric_key(self.monitor, metrics)
        if key is None:
            msg = (
                f"EarlyStoppingHook: the metric {self.monitor!r} is not among the validation metrics "
                f"{sorted(metrics)}.{did_you_mean(self.monitor, list(metrics))} Set `monitor` to one of them"
            )
            if self.strict:
                raise KeyError(msg)
            warnings.warn(msg + " (early stopping skipped this validation).", stacklevel=2)
            return
        reason = self._check(float(metrics[key]))
        if reason:
            loop = trainer.train_loop if self._training else None
            if loop is not None:
                loop.control.request_stop(f"early stopping: {reason}")
            trainer.logger.info("Early stopping: %s", reason if loop is not None else f"{reason} (outside training)")

    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._training = True

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        self._training = False

    def _check(self, value: float) -> str | None:
        """Update the counters with ``value``; return why training should stop, or None."""
        better = self._better
        if self.check_finite and not math.isfinite(value):
            return f"{self.monitor} = {value} is not finite; the best value was {self.best_score:.6g}."
        if self.stopping_threshold is not None and (
            value == self.stopping_threshold or better(value, self.stopping_threshold)
        ):
            self.best_score = value if better(value, self.best_score) else self.best_score
            self.wait_count = 0
            return (
                f"{self.monitor} = {value:.6g} reached the stopping threshold {self.stopping_threshold} (rule "
                f"{self.rule!r})."
            )
        margin = self.min_delta if self.rule == "greater" else -self.min_delta
        if better(value, self.best_score + margin):
            self.best_score = value
            self.wait_count = 0
            return None
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return (
                f"{self.monitor} did not improve by more than {self.min_delta} for {self.wait_count} validations "
                f"(patience {self.patience}); the best value was {self.best_score:.6g}, the last {value:.6g}."
            )
        return None

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.rule == "greater" else a < b

    def state_dict(self) -> dict[str, Any]:
        """Best value so far and the number of bad validations in a row."""
        return {
            "monitor": self.monitor,
            "rule": self.rule,
            "best_score": self.best_score,
            "wait_count": self.wait_count,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the counters; a state saved for another metric or rule is ignored (with a warning)."""
        if not state_dict:
            return
        if state_dict.get("monitor") != self.monitor or state_dict.get("rule") != self.rule:
            warnings.warn(
                f"EarlyStoppingHook: the checkpoint tracked {state_dict.get('monitor')!r} ({state_dict.get('rule')}) "
                "but this hook "
                f"monitors {self.monitor!r} ({self.rule}); starting early stopping afresh. Give the hook another "
                "`state_key` to silence this.",
                stacklevel=2,
            )
            return
        self.best_score = float(state_dict["best_score"])
        self.wait_count = int(state_dict["wait_count"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(monitor={self.monitor!r}, rule={self.rule!r}, min_delta={self.min_delta}, "
            f"patience={self.patience})"
        )
