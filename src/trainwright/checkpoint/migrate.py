"""The checkpoint format's version, and the migrations that bring an older checkpoint to the current format.

Every checkpoint records ``meta["format_version"]`` (:data:`FORMAT_VERSION`; a checkpoint without it is version 1,
the format before versions were recorded). When a piece's saved layout changes, raise :data:`FORMAT_VERSION` and add
one function to :data:`MIGRATIONS` that turns a checkpoint of the previous version into one of the new version: a
restore (:meth:`~trainwright.checkpoint.manager.CheckpointManager.restore`) applies them in order, so a checkpoint of
any earlier release loads. docs/checkpoints.md, "The format and its migrations".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: The format this release writes (``meta["format_version"]``).
FORMAT_VERSION = 1
#: The version of a checkpoint whose ``meta`` records none (written before versions were recorded).
UNVERSIONED = 1

Migration = Callable[[dict[str, Any]], dict[str, Any]]
#: ``{v: function}``: each turns a checkpoint of format ``v`` into one of format ``v + 1`` (a new dict; the input is
#: left as it was). Empty while the format is at its first version.
MIGRATIONS: dict[int, Migration] = {}


class CheckpointFormatError(ValueError):
    """A checkpoint's format cannot be brought to the one this release reads (a newer release wrote it)."""


def format_version(ckpt: Mapping[str, Any]) -> int:
    """The format version a checkpoint records (:data:`UNVERSIONED` when its ``meta`` has none)."""
    meta = ckpt.get("meta")
    version = meta.get("format_version") if isinstance(meta, Mapping) else None
    return int(version) if isinstance(version, int) else UNVERSIONED


def migrate(
    ckpt: dict[str, Any],
    where: str = "checkpoint",
    *,
    migrations: Mapping[int, Migration] | None = None,
    current: int = FORMAT_VERSION,
) -> dict[str, Any]:
    """``ckpt`` brought to format ``current`` by applying ``migrations`` in order (``ckpt`` itself when it is current).

    Args:
        ckpt: A loaded checkpoint dict.
        where: The checkpoint's path, for messages.
        migrations: ``{v: v -> v + 1}`` (default :data:`MIGRATIONS`).
        current: The version to reach (default :data:`FORMAT_VERSION`).

    Returns:
        The checkpoint in format ``current``, its ``meta["format_version"]`` set to it.

    Raises:
        CheckpointFormatError: the checkpoint is of a newer format than ``current`` (written by a newer trainwright),
            or a step between its version and ``current`` has no migration.
    """
    steps = MIGRATIONS if migrations is None else migrations
    version = format_version(ckpt)
    if version == current:
        return ckpt
    if version > current:
        raise CheckpointFormatError(
            f"{where} has checkpoint format {version}, written by a newer trainwright "
            f"(version {_written_by(ckpt)}); this one reads formats up to {current}. Upgrade trainwright to load it"
        )
    out = ckpt
    for v in range(version, current):
        step = steps.get(v)
        if step is None:
            raise CheckpointFormatError(
                f"{where} has checkpoint format {version}; no migration from format {v} to {v + 1} is known, so it "
                f"cannot be brought to format {current}. Load it with the trainwright release that wrote it "
                f"({_written_by(ckpt)}) and save its weights (load_from= reads weights of any format)"
            )
        out = step(out)
    meta = out.get("meta")
    out = {**out, "meta": {**(meta if isinstance(meta, Mapping) else {}), "format_version": current}}
    return out


def _written_by(ckpt: Mapping[str, Any]) -> str:
    meta = ckpt.get("meta")
    return str(meta.get("trainwright_version", "unknown")) if isinstance(meta, Mapping) else "unknown"


__all__ = ["FORMAT_VERSION", "MIGRATIONS", "CheckpointFormatError", "format_version", "migrate"]
