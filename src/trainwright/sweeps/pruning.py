"""The hook that reports each validation's metric to the Optuna trial and stops a trial the pruner gives up on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from trainwright.hooks.hook import Hook
from trainwright.logging.metric_key import metric_key

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


class SweepPruningHook(Hook):
    """Reports the swept metric to the Optuna trial after each validation; stops the trial when the pruner gives up on
    it.

    The step is the epoch (epoch-based loops) or the iteration. The decision is taken on rank
    0 and broadcast, so every process stops at the same point; the stop is
    the train loop's ``control.request_stop(reason)`` (training ends after the current validation, cleanly). A metric
    the validation does not produce stops the trial too (:attr:`missing` then holds the
    metrics it did produce).
    """

    priority = "LOW"  # after the logger (and EMA's val/raw keys), as EarlyStoppingHook

    def __init__(self, trial: Any, metric: str) -> None:
        self.trial = trial
        self.metric = metric
        self.last_value: float | None = None
        self.last_step: int | None = None
        self.pruned = False
        self.missing: list[str] | None = None

    @override
    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:
        """Report the metric and ask the pruner (None: a stop request cut the pass; nothing to report)."""
        loop = trainer.train_loop
        if metrics is None or loop is None:
            return
        key = metric_key(self.metric, metrics)
        if key is None:
            self.missing = sorted(metrics)
            trainer.logger.error(
                f"Sweep: the validation metrics {self.missing} do not include {self.metric!r}; stopping the sweep"
            )
            loop.control.request_stop(f"sweep: the validation metrics do not include {self.metric!r}")
            return
        value = float(metrics[key])
        step = trainer.progress.epoch if loop.by_epoch else trainer.progress.iteration
        self.last_value, self.last_step = value, step
        prune = None
        if trainer.strategy.is_main_process:
            self.trial.report(value, step)
            prune = bool(self.trial.should_prune())
        if trainer.strategy.broadcast_object(prune):
            self.pruned = True
            loop.control.request_stop(f"sweep: trial {self.trial.number} pruned")
            trainer.logger.info(
                f"Sweep: trial {self.trial.number} pruned at {'epoch' if loop.by_epoch else 'iteration'} {step} "
                f"({self.metric} = {value:.6g})"
            )
