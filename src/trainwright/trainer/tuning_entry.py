"""The tuners' entry points on a Trainer: ``trainer.find_lr()`` and ``trainer.find_batch_size()`` delegate here.

Each refuses to start inside a run, checks its arguments before anything is built, builds
what ``train()`` builds (resume / ``load_from`` applied), runs the tuner of
:mod:`trainwright.tuning` (which leaves the trainer bitwise as it was) and, for
``find_batch_size(apply=True)``, hands the new loader config back to the Trainer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainwright.tuning.lr_finder import LRFinderResult, LRRange
    from trainwright.tuning.state import TunableTrainer
    from trainwright.utils.progress import Progress


@dataclass(frozen=True)
class TuningAccess:
    """What the entry points use of a Trainer; the Trainer makes one per call.

    Attributes:
        trainer: The trainer as the tuners read it (model, optim wrapper, train loop, strategy, logger, checkpoints).
        progress: The run's position (``apply=True`` only works before training).
        refuse_inside_run: Raises when a run is in progress (the tuner would change its loader and optimizer).
        build: Builds the train parts and prepares the model, resume / ``load_from`` applied, as ``train()`` does.
        train_loader_cfg: The train loader as given (a ``DataLoader`` or a dict of its arguments).
        use_train_loader: Makes the Trainer build its train parts again, at the next ``train()``, from this loader
            config.
    """

    trainer: TunableTrainer
    progress: Progress
    refuse_inside_run: Callable[[str], None]
    build: Callable[[], None]
    train_loader_cfg: Any
    use_train_loader: Callable[[Any], None]


def find_lr(access: TuningAccess, settings: LRRange) -> LRFinderResult:
    """The learning-rate range test (Lightning's ``Tuner.lr_find``); the trainer is left bitwise as it was.

    ``settings`` (:class:`~trainwright.tuning.lr_finder.LRRange`, the defaults' one home): builds what
    ``trainer.train()`` builds (resume / ``load_from`` applied), then runs up to
    ``num_steps`` updates on the train loader with the lr ramped from ``min_lr`` to
    ``max_lr`` (``mode="exp"`` or ``"linear"``) on every param group (keeping each group's
    ratio to the optimizer's lr), smoothing the loss (``smooth``: the new loss's weight) and
    stopping once it exceeds ``diverge`` x its best. Model, optimizer, schedulers, data
    position, RNG and hook states are restored afterwards, so a following ``train()``
    gives what it gives without the test; no hook runs, nothing is logged per step and no
    checkpoint is written. See docs/diagnose.md.

    Returns:
        The curve (``lrs``, ``losses``), ``suggestion`` (steepest descent of the smoothed
        loss, Lightning's rule) and ``plot(path)`` (a PNG).

    Raises:
        ValueError: ``min_lr >= max_lr``, ``num_steps < 2`` or another argument out of range (checked first).
        RuntimeError: called while a run is in progress (from a hook).
    """
    from trainwright.tuning.lr_finder import find_lr as run_lr_test

    access.refuse_inside_run("find_lr")
    settings.check()
    access.build()
    return run_lr_test(access.trainer, **dataclasses.asdict(settings))


def find_batch_size(
    access: TuningAccess,
    mode: str = "power",
    init: int = 2,
    max_trials: int = 25,
    steps_per_trial: int = 3,
    apply: bool = False,
) -> int:
    """The largest batch size (per process) that ``steps_per_trial`` training steps fit in device memory (CUDA).

    Doubles the batch size from ``init`` until ``torch.cuda.OutOfMemoryError`` (``mode="power"``;
    ``"binsearch"`` then bisects), at most ``max_trials`` sizes; the trainer is left as it was.
    ``apply=True`` makes the train loader use the size found (the loader, optimizer,
    schedulers and loop are built again by ``train()``; only before training started). See
    docs/diagnose.md.

    Raises:
        RuntimeError: the device is not CUDA (it must report out-of-memory), several processes
            run, or ``init`` does not fit.
        ValueError: an argument out of range; ``apply=True`` after training started, or under a strategy
            whose engine fixes the batch size (DeepSpeed).
    """
    from trainwright.tuning.batch_size import check_batch_size_args, with_batch_size
    from trainwright.tuning.batch_size import find_batch_size as search

    access.refuse_inside_run("find_batch_size")
    strategy = access.trainer.strategy
    check_batch_size_args(strategy.device, strategy.world_size, mode, init, max_trials, steps_per_trial)
    if apply:
        if strategy.fixes_batch_size:
            raise ValueError(
                f"find_batch_size(apply=True) cannot rebuild the {type(strategy).__name__}'s engine, which fixes the "
                "batch size when "
                "it is built: set the size it returns as train_dataloader batch_size"
            )
        with_batch_size(access.train_loader_cfg, init)  # a loader whose size cannot be set fails before the search
    access.build()
    if apply and access.progress.iteration:
        raise ValueError(
            "find_batch_size(apply=True) changes the train loader, which only works before training (this trainer is "
            "at "
            f"iteration {access.progress.iteration}); set the size it returns in the config"
        )
    size = search(access.trainer, mode=mode, init=init, max_trials=max_trials, steps_per_trial=steps_per_trial)
    if apply:
        access.use_train_loader(with_batch_size(access.train_loader_cfg, size))
        access.trainer.logger.info(f"train_dataloader batch_size set to {size}")
    return size
