"""What a Trainer restores before its first run: ``resume`` (the full state) or else ``load_from`` (weights only); model
weights loaded on request."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from trainwright.checkpoint import load_model_weights
from trainwright.checkpoint.storage import Location, location
from trainwright.trainer.runs import config_changes

if TYPE_CHECKING:
    from trainwright.checkpoint.manager import CheckpointManager
    from trainwright.strategies.base import Strategy
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


def nothing_to_train(progress: Progress, max_iters: int, shape_change: str | None) -> str | None:
    """The warning of a ``train()`` that starts where training is complete (a resumed finished run), naming a
    mid-epoch checkpoint's loader shape change (``DataOrderState.shape_change``); None when there is training left."""
    if progress.iteration < max_iters:
        return None
    return (
        f"Nothing to train: training is complete at iteration {progress.iteration} of max_iters {max_iters} "
        f"(epoch {progress.epoch}). Raise train_cfg max_epochs / max_iters to train further, or use a "
        "new work_dir for a new run."
        + (
            f" The checkpoint was written in the middle of an epoch with a train_dataloader of another "
            f"shape ({shape_change}): max_iters {max_iters} counts this loader's "
            "batches, and the resumed epoch is already over with it."
            if shape_change is not None
            else ""
        )
    )


class PendingRestore:
    """``resume`` / ``load_from``, applied before a trainer's first run and again by ``train()`` when that run had no
    optimizer (a pass before ``train()`` restores what exists; ``train()`` again, with its optimizer)."""

    def __init__(
        self,
        resume: bool | str | Path,
        load_from: str | Path | None,
        *,
        trains: bool,
        config: Mapping[str, Any],
        progress: Progress,
        logger: logging.Logger,
        load_weights: Callable[[str | Path], Any],
    ) -> None:
        self.resume, self.load_from, self.trains = resume, load_from, trains
        self.config, self.progress, self.logger, self.load_weights = config, progress, logger, load_weights
        #: Whether :meth:`apply` restores at its next call.
        self.due = True

    def resume_from(self, path: str | Path) -> None:
        """Resume from ``path`` at the next :meth:`apply` (``Trainer.resume_from``)."""
        self.resume, self.due = Path(path), True

    def apply(self, checkpoints: CheckpointManager, *, train_built: bool) -> None:
        """Restore through ``checkpoints`` if due (:func:`resume_or_load`); due again while the train parts are not
        built (``train_built``) in a trainer that trains. Marked done only once it succeeded: a failed restore is
        tried (and fails) again, never skipped."""
        if self.due:
            resume_or_load(
                checkpoints,
                self.resume,
                self.load_from,
                trains=self.trains,
                config=self.config,
                progress=self.progress,
                logger=self.logger,
                load_weights=self.load_weights,
            )
            self.due = not train_built and self.trains


def load_weights(
    model: nn.Module,
    strategy: Strategy,
    path: str | Path,
    *,
    prepared: bool,
    within: Location | None,
    strict: bool,
    revise_keys: list[tuple[str, str]],
    logger: logging.Logger,
) -> Any:
    """``Trainer.load_weights``: the weights at ``path`` (relative to ``within``, the checkpoint folder) into ``model``
    (the user's); once ``prepared``, the strategy copies them in (a sharded model takes full tensors only through
    it)."""
    load = (lambda weights: strategy.load_model_state_dict(weights, strict=False)) if prepared else None
    result = load_model_weights(
        model,
        strategy.load_checkpoint(location(path, within=within)),
        strict=strict,
        revise_keys=revise_keys,
        load=load,
    )
    logger.info(f"Loaded weights from {path}")
    return result
