"""Where and how a run's checkpoints are stored: the settings the Trainer gives its checkpoint manager when it builds
it.

``Trainer(checkpoint=dict(...))`` and the same keys under ``default_hooks.checkpoint`` (mmengine's) end up
here, so a save before ``train()`` and every save during it use the same folder, keep-k, names and pieces.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwright.checkpoint.retention import Retention
from trainwright.checkpoint.storage import Location, RemotePath, Store, location
from trainwright.registry import did_you_mean

#: The keys of ``Trainer(checkpoint=dict(...))``.
KEYS: tuple[str, ...] = (
    "out_dir",
    "storage_options",
    "max_keep_ckpts",
    "keep",
    "weights_every",
    "async_save",
    "epoch_tmpl",
    "iter_tmpl",
    "save_optimizer",
    "save_param_scheduler",
)


def check_template(tmpl: Any, key: str = "filename_tmpl") -> str:
    """``tmpl`` if it names checkpoints that resume finds (one ``{}``, ``.pth``, not hidden nor ``best_``); else a
    ValueError naming ``key``."""
    if (
        not isinstance(tmpl, str)
        or tmpl.count("{}") != 1
        or "/" in tmpl
        or not tmpl.endswith(".pth")
        or tmpl.startswith((".", "best_"))
    ):
        raise ValueError(
            f"CheckpointHook {key} must be a file name with exactly one '{{}}' for the epoch / iteration that ends in "
            "'.pth' "
            f"and starts neither with '.' nor 'best_' (resume looks for such files), e.g. 'epoch_{{}}.pth'; got "
            f"{tmpl!r}"
        )
    return tmpl


@dataclass(frozen=True)
class CheckpointSettings:
    """Where checkpoints go and what they hold; given to :class:`~trainwright.checkpoint.manager.CheckpointManager` at
    build.

    Attributes:
        out_dir: The checkpoint folder (None: ``work_dir/checkpoints``): a local path, a URL (an
            :class:`~trainwright.checkpoint.storage.FsspecStore` is made for it, with ``storage_options``)
            or a :class:`~trainwright.checkpoint.storage.Store` of your own. ``resume=True`` looks here.
        max_keep_ckpts: Periodic checkpoints kept (-1: all).
        weights_every: Of the periodic checkpoints older than the last ``max_keep_ckpts``, those whose number is a
            multiple of it are thinned to weights (0: deleted). Given as ``keep=dict(last=k, weights_every=n)``
            (:mod:`trainwright.checkpoint.retention`).
        async_save: Write in a background thread.
        epoch_tmpl / iter_tmpl: Names of periodic checkpoints (one ``{}``).
        save_optimizer / save_param_scheduler: Whether checkpoints hold those states (needed to resume).
        epoch_names: A save at an epoch's end takes the epoch's name (``epoch_tmpl``): set by the Trainer for an
            epoch-based train loop (not a key of ``Trainer(checkpoint=...)``).
    """

    out_dir: Location | None = None
    max_keep_ckpts: int = -1
    weights_every: int = 0
    async_save: bool = False
    epoch_tmpl: str = "epoch_{}.pth"
    iter_tmpl: str = "iter_{}.pth"
    save_optimizer: bool = True
    save_param_scheduler: bool = True
    epoch_names: bool = False

    @property
    def retention(self) -> Retention:
        """What the run keeps: the last ``max_keep_ckpts`` whole, older ones thinned every ``weights_every``."""
        return Retention(self.max_keep_ckpts, self.weights_every)

    @property
    def exclude(self) -> tuple[str, ...]:
        """The pieces left out of periodic, best and save-now checkpoints."""
        return ("optim_wrapper",) * (not self.save_optimizer) + ("param_schedulers",) * (not self.save_param_scheduler)

    @classmethod
    def build(
        cls, given: Mapping[str, Any] | None = None, *more: Mapping[str, Any], epoch_names: bool = False
    ) -> CheckpointSettings:
        """The settings of ``Trainer(checkpoint=given)`` plus those a hook was given (``default_hooks.checkpoint``'s
        ``out_dir``...); ``epoch_names``: the train loop is epoch-based.

        Raises:
            TypeError: an unknown key (with the close matches).
            ValueError: a value that cannot work (``max_keep_ckpts=0``, ``storage_options`` without a URL, a
                template resume would not find), or one key given two different values.
        """
        merged: dict[str, Any] = {}
        for source in (given or {}, *more):
            for key, value in source.items():
                if key not in KEYS:
                    raise TypeError(
                        f"checkpoint={{...}}: unknown key {key!r}.{did_you_mean(key, list(KEYS))} Keys: {list(KEYS)}"
                    )
                if key in merged and merged[key] != value:
                    raise ValueError(
                        f"The checkpoint setting {key!r} is given twice, as {merged[key]!r} and {value!r} "
                        "(Trainer(checkpoint=...) and "
                        "default_hooks.checkpoint); give it once"
                    )
                merged[key] = value
        if "keep" in merged:  # keep=dict(last=k, weights_every=n): max_keep_ckpts=k plus thinning
            kept = Retention.parse(merged.pop("keep"))
            for key, value in (("max_keep_ckpts", kept.last), ("weights_every", kept.weights_every)):
                if merged.get(key, value) != value:
                    raise ValueError(
                        f"checkpoint keep={kept} and {key}={merged[key]!r} disagree; give keep=dict(last=..., "
                        "weights_every=...) alone"
                    )
                merged[key] = value
        options = merged.pop("storage_options", None)
        out_dir = merged.pop("out_dir", None)
        if options is not None and not (isinstance(out_dir, str) and "://" in out_dir):
            raise ValueError(
                "CheckpointHook storage_options apply to a URL out_dir (s3://..., memory://...), but out_dir is "
                f"{out_dir!r}; "
                "drop storage_options or give a URL"
            )
        if merged.get("max_keep_ckpts") == 0:
            raise ValueError(
                "CheckpointHook max_keep_ckpts=0 would delete every checkpoint; use -1 to keep all or k >= 1"
            )
        if merged.get("weights_every"):
            Retention.parse({"last": merged.get("max_keep_ckpts", -1), "weights_every": merged["weights_every"]})
        for key in ("epoch_tmpl", "iter_tmpl"):
            if key in merged:
                check_template(merged[key], key)
        where = location(out_dir, options) if isinstance(out_dir, (str, os.PathLike, RemotePath, Store)) else out_dir
        if where is not None and not isinstance(where, (Path, RemotePath)):
            raise TypeError(
                "checkpoint out_dir must be a path, a URL or a trainwright.checkpoint.storage.Store, got "
                f"{type(out_dir).__name__}"
            )
        return cls(out_dir=where, epoch_names=epoch_names, **merged)
