"""CheckpointHook: periodic, last and best checkpoints, written atomically, kept k at a time.

What a run can rely on:

* Every file is written through ``trainer.save_checkpoint`` (the strategy's
  ``save_checkpoint``: atomic, rank 0, in the background with ``async_save``).
* Every file is complete or absent (:func:`~trainwright.checkpoint.atomic_save`), the
  ``latest`` pointer is updated only after its file is complete, and checkpoints that fall
  out of the keep window are deleted only after that, so a ``kill -9`` at any moment
  leaves at least one complete checkpoint that ``latest`` (or the directory listing) finds.
* A checkpoint due at a point where validation also runs (the end of an epoch, or an
  iteration that validates) is written **after** that validation, so it holds the best
  score and the metrics of that validation and a resumed run does not validate twice or
  skip one.
* Validation during training does not move the training random streams (the train loop
  puts the RNG states back after each validation pass), so a run resumed from a checkpoint
  written before a validation it then skips draws the same random numbers as a run that did it.
* While it trains, the hook serves :meth:`Trainer.request_checkpoint
  <trainwright.Trainer.request_checkpoint>` (e.g. on preemption) with :meth:`CheckpointHook.save_now`.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView, TrainLoopView

_TMP_NAME = re.compile(r"^\..+\.tmp\.(?P<pid>\d+)\.[0-9a-f]+$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _train_loop(trainer: TrainerView) -> TrainLoopView:
    return require_train_loop(trainer, "CheckpointHook (it saves training checkpoints)")


@HOOKS.register
class CheckpointHook(Hook):
    """Saves ``epoch_{n}.pth`` / ``iter_{n}.pth`` (and ``best_*.pth``) into ``work_dir/checkpoints``.

    Args:
        interval: Save every ``interval`` epochs (``by_epoch``) or iterations; <= 0 disables
            periodic saving (the final checkpoint is still written when ``save_last``).
        by_epoch: Count ``interval`` in epochs or in iterations.
        max_keep_ckpts: Keep only the newest k periodic checkpoints (-1: keep all). Old ones
            are deleted only after the new one (and the ``latest`` pointer) is complete.
        save_last: Also save when training ends (normally, early-stopped or preempted), unless
            that iteration was just saved.
        save_optimizer / save_param_scheduler: Include those states (needed to resume).
        save_best: A metric key (``"val/acc"``) or ``"auto"`` (the first validation metric):
            keep ``best_<metric>_<epoch|iter>_<n>.pth`` of the best scores so far.
        rule: ``"greater"`` or ``"less"``; inferred from the metric name if None
            (``loss`` / ``error`` → less).
        max_keep_best: How many best checkpoints to keep (the k best scores).
        out_dir: Directory for the files (default ``work_dir/checkpoints``).
        async_save: Write in a background thread; the loop only waits for the copy of the
            state to CPU memory (see :mod:`trainwright.checkpoint.async_writer`).
        clean_stale_tmp: At the start of training, rank 0 deletes temporary files that
            writers killed mid-write left in the directory (those of processes that no
            longer exist).
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
        max_keep_best: int = 1,
        out_dir: str | Path | None = None,
        async_save: bool = False,
        clean_stale_tmp: bool = True,
    ) -> None:
        if rule not in (None, "greater", "less"):
            raise ValueError(f"CheckpointHook rule must be 'greater', 'less' or None, got {rule!r}")
        if max_keep_best < 1:
            raise ValueError(f"CheckpointHook max_keep_best must be >= 1, got {max_keep_best}")
        if max_keep_ckpts == 0:
            raise ValueError("CheckpointHook max_keep_ckpts=0 would delete every checkpoint; use -1 to keep all or k >= 1")
        self.interval = interval
        self.by_epoch = by_epoch
        self.max_keep_ckpts = max_keep_ckpts
        self.save_last = save_last
        self.save_optimizer = save_optimizer
        self.save_param_scheduler = save_param_scheduler
        self.save_best = save_best
        self.rule = rule
        self.max_keep_best = max_keep_best
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.async_save = async_save
        self.clean_stale_tmp = clean_stale_tmp
        self.kept: list[str] = []
        self.best: list[tuple[float, str]] = []  # best first
        self._last_saved_iter = -1
        self._pending: str | None = None
        self._pending_best: tuple[float, str] | None = None
        self._in_train = False

    @property
    def best_score(self) -> float | None:
        """The best monitored score so far (None before the first validation)."""
        return self.best[0][0] if self.best else None

    @property
    def best_ckpt(self) -> str | None:
        """File name of the best checkpoint so far."""
        return self.best[0][1] if self.best else None

    # -- state (kept files, best scores survive resume) -------------------------------------
    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"kept": list(self.kept), "best": [[s, n] for s, n in self.best], "best_score": self.best_score, "best_ckpt": self.best_ckpt, "last_saved_iter": self._last_saved_iter}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: D102
        self.kept = list(state.get("kept", []))
        if "best" in state:
            self.best = [(float(s), str(n)) for s, n in state["best"]]
        elif state.get("best_score") is not None:
            self.best = [(float(state["best_score"]), str(state.get("best_ckpt")))]
        self._last_saved_iter = int(state.get("last_saved_iter", -1))

    # -- events ---------------------------------------------------------------------------
    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._in_train = True
        trainer.set_checkpoint_server(self.save_now)
        if self.by_epoch and self.interval > 0 and not _train_loop(trainer).by_epoch:
            trainer.logger.warning(
                "CheckpointHook counts its interval in epochs (by_epoch=True) but training is iteration-based: only the final "
                "checkpoint will be written. Set default_hooks=dict(checkpoint=dict(by_epoch=False, interval=N)) to save every N iterations."
            )
        if self.clean_stale_tmp and trainer.is_main_process:
            self._clean_stale_tmp(trainer)

    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        # Epoch-interval saves are requested (and a pending one flushed) at epoch events only.
        return 0 if self.by_epoch or self.interval <= 0 else self.interval

    def after_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        if self._pending is not None:  # a validation we waited for did not come: save what we have
            self._flush_pending(trainer)
        if not self.by_epoch and self.interval > 0 and trainer.progress.iteration % self.interval == 0:
            loop = _train_loop(trainer)
            self._request(trainer, f"iter_{trainer.progress.iteration}.pth", not loop.by_epoch and loop.val_due())

    def after_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        loop = _train_loop(trainer)
        if self.by_epoch and self.interval > 0 and loop.by_epoch and trainer.progress.epoch % self.interval == 0:
            self._request(trainer, f"epoch_{trainer.progress.epoch}.pth", loop.val_due())

    def before_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self._flush_pending(trainer)

    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        if not self.save_best or not metrics or not self._in_train:
            return
        key = next(iter(metrics)) if self.save_best == "auto" else self.save_best
        if key not in metrics:
            raise KeyError(f"CheckpointHook save_best={self.save_best!r} is not among the validation metrics {sorted(metrics)}; set save_best to one of them")
        score = float(metrics[key])
        if math.isnan(score):
            return
        rule = self.rule or ("less" if any(s in key for s in ("loss", "error", "err")) else "greater")
        worst = self.best[-1][0] if self.best else None
        if len(self.best) >= self.max_keep_best and worst is not None and not (score > worst if rule == "greater" else score < worst):
            return
        p = trainer.progress
        unit, n = ("epoch", p.epoch) if _train_loop(trainer).by_epoch else ("iter", p.iteration)
        self._pending_best = (score, f"best_{key.replace('/', '_')}_{unit}_{n}.pth")
        self._rule = rule

    def after_val(self, trainer: TrainerView) -> None:  # noqa: D102
        if not self._in_train:
            return
        if self._pending_best is not None:
            score, name = self._pending_best
            self._pending_best = None
            sign = -1.0 if self._rule == "greater" else 1.0
            ranked = sorted([*[b for b in self.best if b[1] != name], (score, name)], key=lambda b: sign * b[0])
            self.best, dropped = ranked[: self.max_keep_best], [n for _, n in ranked[self.max_keep_best :]]
            self._write(trainer, name, latest=False, remove=dropped)
            trainer.logger.info(f"New best score {score:.4f}: saved {name}")
        self._flush_pending(trainer)

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._flush_pending(trainer)
        if self.save_last:
            self.save_now(trainer)
        trainer.strategy.wait_for_checkpoint()

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        if self._in_train:
            trainer.set_checkpoint_server(None)
            if self._pending is not None:
                # The run ended by an error after a checkpoint was due but before the validation
                # it waited for finished (a metric that raised): the epoch's training is not lost.
                trainer.logger.warning(f"Writing {self._pending}, which was due before the run stopped (it waited for a validation that did not finish)")
                self._flush_pending(trainer)
        self._in_train = False
        self._pending = None
        trainer.strategy.wait_for_checkpoint()

    # -- public ---------------------------------------------------------------------------
    def save_now(self, trainer: TrainerView) -> Path | None:
        """Save the current state as a periodic checkpoint unless this iteration is saved already.

        Used at the end of training and, as the trainer's checkpoint server, by
        ``trainer.request_checkpoint()`` (preemption); returns the path written (or None).
        """
        self._flush_pending(trainer)
        p = trainer.progress
        if p.iteration == self._last_saved_iter:
            return None
        name = f"epoch_{p.epoch}.pth" if _train_loop(trainer).by_epoch and p.iter_in_epoch == 0 else f"iter_{p.iteration}.pth"
        self._save_periodic(trainer, name)
        return self.ckpt_dir(trainer) / name

    def ckpt_dir(self, trainer: TrainerView) -> Path:
        """Where this hook writes."""
        return self.out_dir if self.out_dir is not None else trainer.ckpt_dir

    def _request(self, trainer: TrainerView, name: str, after_val: bool) -> None:
        self._pending = name
        if not after_val:
            self._flush_pending(trainer)

    def _flush_pending(self, trainer: TrainerView) -> None:
        name, self._pending = self._pending, None
        if name is not None:
            self._save_periodic(trainer, name)

    # -- writing --------------------------------------------------------------------------
    def _save_periodic(self, trainer: TrainerView, name: str) -> None:
        kept = [k for k in self.kept if k != name] + [name]
        dropped: list[str] = []
        if self.max_keep_ckpts > 0 and len(kept) > self.max_keep_ckpts:
            dropped, kept = kept[: -self.max_keep_ckpts], kept[-self.max_keep_ckpts :]
        self.kept = kept
        self._last_saved_iter = trainer.progress.iteration
        # Log records up to this point must survive a kill: the resumed run will not log them again.
        trainer.flush_logs()
        self._write(trainer, name, latest=True, remove=dropped)

    def _write(self, trainer: TrainerView, name: str, latest: bool, remove: list[str]) -> None:
        from trainwright.checkpoint.io import write_latest

        d = self.ckpt_dir(trainer)
        # files still wanted (a name can be both dropped from one list and kept in the other)
        wanted = set(self.kept) | {n for _, n in self.best} | {name}
        remove = [r for r in remove if r not in wanted]

        def finish() -> None:  # rank 0, once the file is complete
            if latest:
                write_latest(d, name)
            for old in remove:
                (d / old).unlink(missing_ok=True)

        path = trainer.save_checkpoint(d / name, self.save_optimizer, self.save_param_scheduler, async_save=self.async_save, after=finish)
        trainer.logger.info(f"Saving checkpoint {path} in the background" if self.async_save else f"Saved checkpoint {path}")

    def _clean_stale_tmp(self, trainer: TrainerView) -> None:
        d = self.ckpt_dir(trainer)
        if not d.is_dir():
            return
        trainer.strategy.wait_for_checkpoint()  # no write of this process is in flight: its temporary files are stale too
        me = os.getpid()
        for p in d.iterdir():
            m = _TMP_NAME.match(p.name)
            if m is None:
                continue
            pid = int(m["pid"])
            if pid == me or not _pid_alive(pid):
                p.unlink(missing_ok=True)
                trainer.logger.info(f"Removed {p.name}, left by a checkpoint write that was interrupted")
