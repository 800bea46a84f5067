"""The checkpoint settings and record the Trainer gives its checkpoint manager when it builds it, from its arguments
and what its hooks declare (``Hook.checkpoint_settings``, ``Hook.checkpoint_record``, ``Hook.stores``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainwright.checkpoint.manager import SaveRecord
from trainwright.checkpoint.settings import CheckpointSettings
from trainwright.checkpoint.storage import RemotePath
from trainwright.hooks.hook import Hook
from trainwright.trainer.build import train_by_epoch


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
