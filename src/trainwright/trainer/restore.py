"""What a Trainer restores before its first run: ``resume`` (the full state) or else ``load_from`` (weights only)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwright.trainer.runs import config_changes

if TYPE_CHECKING:
    from trainwright.checkpoint.manager import CheckpointManager
    from trainwright.utils.progress import Progress


def resume_or_load(
    checkpoints: CheckpointManager,
    resume: bool | str | Path,
    load_from: str | Path | None,
    *,
    trains: bool,
    config: Mapping[str, Any],
    progress: Progress,
    logger: logging.Logger,
    load_weights: Callable[[str | Path], Any],
) -> None:
    """Apply ``resume`` (full state) or else ``load_from`` (weights only through ``load_weights``).

    ``resume=True`` restores the newest checkpoint that loads, else a training checkpoint at
    ``load_from`` (mmengine's ``resume=True`` + ``load_from=PATH``); a path restores that one.
    Resume applies only to a trainer that trains (``trains``: a train loader and an optim
    wrapper). Every piece is checked before anything changes (see
    :meth:`~trainwright.checkpoint.manager.CheckpointManager.restore`); settings that differ
    from the checkpoint's run are named in a warning.
    """
    if resume and trains:
        found = checkpoints.find_and_restore(None if resume is True else resume)
        if found is None and resume is True and load_from is not None:  # nothing of its own: mmengine resumes load_from
            found = checkpoints.restore_if_training_checkpoint(load_from)
            if found is not None:
                logger.info(
                    f"resume=True found no checkpoint in {checkpoints.ckpt_dir}; load_from {str(load_from)!r} is a "
                    "training "
                    "checkpoint: resuming it (as mmengine does)"
                )
        if found is not None:
            path, ckpt = found
            logger.info(f"Resumed from {path} at epoch {progress.epoch}, iteration {progress.iteration}")
            if checkpoints.skipped:
                logger.warning(
                    f"Resumed from {path}, not from the newer "
                    + "; ".join(f"{p.name} (skipped: {why})" for p, why in checkpoints.skipped)
                )
            meta = ckpt.get("meta")
            changed = config_changes(meta.get("config") if isinstance(meta, Mapping) else None, config)
            if changed:
                logger.warning(
                    f"Resumed from {path}: the model, the optimizer state (its lr, momentum...), the schedulers, the "
                    "progress, the data order "
                    "and the random streams come from the checkpoint. Settings that differ from the checkpoint's run: "
                    + "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
                    + ". train_cfg, hooks, data and the other settings apply as given now; edited optimizer or "
                    "scheduler values do not "
                    "(the checkpoint's win): to train with them, start a new run from these weights with load_from=."
                )
            return
        logger.info(f"resume=True but no checkpoint in {checkpoints.ckpt_dir}; starting from scratch")
    if load_from is not None:
        load_weights(load_from)
