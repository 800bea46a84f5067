"""CheckpointHook: periodic, last and best checkpoints, written atomically, kept k at a time."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer


@HOOKS.register
class CheckpointHook(Hook):
    """Saves ``epoch_{n}.pth`` / ``iter_{n}.pth`` into ``work_dir/checkpoints``.

    Args:
        interval: Save every ``interval`` epochs (``by_epoch``) or iterations; <= 0 disables
            periodic saving (the final checkpoint is still written when ``save_last``).
        by_epoch: Count ``interval`` in epochs or in iterations.
        max_keep_ckpts: Keep only the newest k periodic checkpoints (-1: keep all). Old ones
            are deleted only after the new one is complete on disk.
        save_last: Also save at the end of training.
        save_optimizer / save_param_scheduler: Include those states (needed to resume).
        save_best: A metric key (``"val/acc"``) or ``"auto"`` (the first validation metric):
            keep ``best_<metric>_<epoch|iter>_<n>.pth`` of the best score so far.
        rule: ``"greater"`` or ``"less"``; inferred from the metric name if None
            (``loss`` / ``error`` → less).
        out_dir: Directory for the files (default ``work_dir/checkpoints``).
    """

    priority = "VERY_LOW"

    def __init__(
        self,
        interval: int = 1,
        by_epoch: bool = True,
        max_keep_ckpts: int = -1,
        save_last: bool = True,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        save_best: str | None = None,
        rule: str | None = None,
        out_dir: str | Path | None = None,
    ) -> None:
        if rule not in (None, "greater", "less"):
            raise ValueError(f"CheckpointHook rule must be 'greater', 'less' or None, got {rule!r}")
        self.interval = interval
        self.by_epoch = by_epoch
        self.max_keep_ckpts = max_keep_ckpts
        self.save_last = save_last
        self.save_optimizer = save_optimizer
        self.save_param_scheduler = save_param_scheduler
        self.save_best = save_best
        self.rule = rule
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.kept: list[str] = []
        self.best_score: float | None = None
        self.best_ckpt: str | None = None
        self._last_saved_iter = -1

    # -- state (best score and kept files survive resume) -----------------------------------
    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"kept": list(self.kept), "best_score": self.best_score, "best_ckpt": self.best_ckpt}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: D102
        self.kept = list(state.get("kept", []))
        self.best_score = state.get("best_score")
        self.best_ckpt = state.get("best_ckpt")

    # -- events ---------------------------------------------------------------------------
    def after_train_iter(self, trainer: Trainer, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        if not self.by_epoch and self.interval > 0 and trainer.progress.iteration % self.interval == 0:
            self._save_periodic(trainer, f"iter_{trainer.progress.iteration}.pth")

    def after_train_epoch(self, trainer: Trainer) -> None:  # noqa: D102
        if self.by_epoch and self.interval > 0 and trainer.train_loop.by_epoch and trainer.progress.epoch % self.interval == 0:
            self._save_periodic(trainer, f"epoch_{trainer.progress.epoch}.pth")

    def after_train(self, trainer: Trainer) -> None:  # noqa: D102
        if self.save_last and trainer.progress.iteration != self._last_saved_iter and not trainer.should_stop:
            name = f"epoch_{trainer.progress.epoch}.pth" if trainer.train_loop.by_epoch and trainer.progress.iter_in_epoch == 0 else f"iter_{trainer.progress.iteration}.pth"
            self._save_periodic(trainer, name)

    def after_val_epoch(self, trainer: Trainer, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        if not self.save_best or not metrics or trainer.train_loop is None:
            return
        key = next(iter(metrics)) if self.save_best == "auto" else self.save_best
        if key not in metrics:
            raise KeyError(f"CheckpointHook save_best={self.save_best!r} is not among the validation metrics {sorted(metrics)}; set save_best to one of them")
        score = float(metrics[key])
        rule = self.rule or ("less" if any(s in key for s in ("loss", "error", "err")) else "greater")
        better = self.best_score is None or (score > self.best_score if rule == "greater" else score < self.best_score)
        if not better or math.isnan(score):
            return
        self.best_score = score
        p = trainer.progress
        unit, n = ("epoch", p.epoch) if trainer.train_loop.by_epoch else ("iter", p.iteration)
        name = f"best_{key.replace('/', '_')}_{unit}_{n}.pth"
        old = self.best_ckpt
        self.best_ckpt = name
        self._write(trainer, name, latest=False)
        if old and old != name:
            self._remove(trainer, old)
        trainer.logger.info(f"New best {key}={score:.4f}: saved {name}")

    # -- writing --------------------------------------------------------------------------
    def ckpt_dir(self, trainer: Trainer) -> Path:
        """Where this hook writes."""
        return self.out_dir if self.out_dir is not None else trainer.ckpt_dir

    def _save_periodic(self, trainer: Trainer, name: str) -> None:
        self.kept = [k for k in self.kept if k != name] + [name]
        self._last_saved_iter = trainer.progress.iteration
        self._write(trainer, name, latest=True)
        if self.max_keep_ckpts > 0:
            while len(self.kept) > self.max_keep_ckpts:
                self._remove(trainer, self.kept.pop(0))

    def _write(self, trainer: Trainer, name: str, latest: bool) -> None:
        from trainwright.checkpoint.io import write_latest

        d = self.ckpt_dir(trainer)
        trainer.save_checkpoint(d / name, self.save_optimizer, self.save_param_scheduler)
        if latest and trainer.is_main_process:
            write_latest(d, name)
        trainer.logger.info(f"Saved checkpoint {d / name}")

    def _remove(self, trainer: Trainer, name: str) -> None:
        if trainer.is_main_process:
            (self.ckpt_dir(trainer) / name).unlink(missing_ok=True)
