"""The Trainer's checkpoint manager and its pieces; the settings and record it is given, from the Trainer's arguments
and what its hooks declare (``Hook.checkpoint_settings``, ``Hook.checkpoint_record``, ``Hook.stores``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwright.checkpoint.manager import CheckpointManager, SaveRecord
from trainwright.checkpoint.settings import CheckpointSettings
from trainwright.checkpoint.storage import RemotePath
from trainwright.hooks.hook import Hook
from trainwright.trainer.build import train_by_epoch
from trainwright.trainer.state import OPTIONAL_PIECES, HookStates, MetaState, ModelState

if TYPE_CHECKING:
    from trainwright.hooks.dispatch import HookList
    from trainwright.logging.message_hub import MessageHub
    from trainwright.logging.metric_store import MetricStore
    from trainwright.strategies.base import Strategy
    from trainwright.trainer.seeding import RunSeed
    from trainwright.utils.progress import Progress


def checkpoint_settings(
    checkpoint: Mapping[str, Any] | None, hooks: Sequence[Hook], train_cfg: Mapping[str, Any]
) -> CheckpointSettings:
    """``Trainer(checkpoint=...)`` merged with the hooks' settings, names as the train loop counts (``epoch_names``);
    the checkpoint store and every store a hook declares are checked first.

    Raises:
        TypeError / ValueError: a bad setting (see :meth:`CheckpointSettings.build`), before anything is created.
        OSError: a store that cannot be reached (missing bucket, refused credentials, no endpoint), naming the URL.
    """
    settings = CheckpointSettings.build(
        checkpoint, *(h.checkpoint_settings for h in hooks), epoch_names=train_by_epoch(train_cfg)
    )
    if isinstance(settings.out_dir, RemotePath) and not settings.out_dir.store.checked:
        settings.out_dir.store.check("CheckpointHook out_dir")
    for h in hooks:
        for store in h.stores():
            if not store.checked:
                store.check(f"{type(h).__name__} out_dir")
    return settings


def checkpoint_record(hooks: Sequence[Hook]) -> SaveRecord | None:
    """The record of saves a hook keeps as its state (the checkpoint hook's), for the manager; None: no hook keeps
    one (the manager keeps its own). With several, the last one's (the lowest priority's), as mmengine's last save
    wins."""
    records = [r for h in hooks if (r := h.checkpoint_record()) is not None]
    return records[-1] if records else None


def build_checkpoints(
    strategy: Strategy,
    work_dir: Path,
    settings: CheckpointSettings,
    record: SaveRecord | None,
    *,
    progress: Progress,
    config: dict[str, Any],
    seed: RunSeed,
    metric_store: MetricStore,
    message_hub: MessageHub,
    hooks: HookList,
    logger: logging.Logger,
    flush: Callable[[], None],
    events: Mapping[str, Any],
) -> CheckpointManager:
    """The run's checkpoint manager (``work_dir/checkpoints``), its pieces those that exist when the Trainer is built;
    the train parts' (``optim_wrapper``, ``param_schedulers``, ``train_dataloader``, ``data_state``) are None until
    the train loop is built (:func:`~trainwright.trainer.build.train_pieces`). ``flush`` runs before each save,
    ``events`` are the hooks' callbacks (``HookList.checkpoint_events``); ``record`` is :func:`checkpoint_record`'s."""
    pieces: dict[str, Any] = {
        "meta": MetaState(progress, strategy.world_size, config, seed, logger),
        "model": ModelState(strategy),
        "optim_wrapper": None,
        "param_schedulers": None,
        "progress": progress,
        "train_dataloader": None,
        "data_state": None,  # the stream's own position (a stateful loader's)
        "metric_store": metric_store,
        "message_hub": message_hub,
        "hooks": HookStates(hooks),
    }
    return CheckpointManager(
        strategy,
        pieces,
        work_dir / "checkpoints",
        progress=progress,
        logger=logger,
        flush=flush,
        **events,
        required=("model", "progress"),
        optional=OPTIONAL_PIECES,
        settings=settings,
        record=record,
    )
