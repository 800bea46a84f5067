"""The checkpoints of a folder: the ``latest`` pointer, the resume candidates, the newest that loads.

Resume candidates are a folder's ``*.pth`` files (or a sharded strategy's directories), newest
first, the ``latest`` one in front; temporaries, ``best_*.pth`` and published files
(``<name>-<8 hex>.pth``) are not candidates. A folder may be an fsspec URL
(:mod:`trainwright.checkpoint.storage`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from trainwright.checkpoint.io import (
    CHECKPOINT_SUFFIX,
    TMP_MARKER,
    CheckpointError,
    MapLocation,
    PathLike,
    UnsafeCheckpointError,
    load_file,
    write_whole,
)
from trainwright.checkpoint.storage import Location, RemotePath, location

LATEST_FILENAME = "latest"
"""Name of the text file that holds the file name of the last checkpoint written."""

BEST_PREFIX = "best_"
_STEP_NAME = re.compile(r"^(?P<kind>[A-Za-z]+)_(?P<step>\d+)\.[A-Za-z]+$")
#: A published checkpoint, ``<name>-<first 8 hex digits of its sha256>.pth``: weights for release, not a resume point.
_PUBLISHED_NAME = re.compile(r"-[0-9a-f]{8}\.pth$")


def write_latest(ckpt_dir: PathLike | RemotePath, filename: str) -> None:
    """Record ``filename`` (a name inside ``ckpt_dir``) as the last checkpoint written.

    The pointer is a small text file named ``latest``, not a symlink: it works on every
    filesystem and survives copying the directory. In a remote folder it is one object (one PUT). On
    local disk it is in place on return and fsynced in the background, as the synchronous save it
    points at (:mod:`trainwright.checkpoint.durability`).
    """
    write_whole(location(ckpt_dir) / LATEST_FILENAME, (Path(filename).name + "\n").encode("utf-8"), durable=False)


def read_latest(ckpt_dir: PathLike | RemotePath) -> str | None:
    """Return the file name recorded by :func:`write_latest`, or ``None`` if there is none."""
    try:
        name = (location(ckpt_dir) / LATEST_FILENAME).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return Path(name).name or None


def _is_resume_candidate(p: Location, suffix: str | tuple[str, ...] = CHECKPOINT_SUFFIX) -> bool:
    name = p.name
    return (
        name.endswith(suffix)
        and not name.startswith(".")
        and TMP_MARKER not in name
        and not name.startswith(BEST_PREFIX)
        and _PUBLISHED_NAME.search(name) is None
        and (
            p.is_file() if name.endswith(CHECKPOINT_SUFFIX) else p.exists()
        )  # a file; a sharded checkpoint is a directory
    )


def step_of(name: str) -> int:
    """``N`` of a ``<kind>_<N>`` checkpoint name (``epoch_3.pth``: 3), -1 for any other name."""
    m = _STEP_NAME.match(name)
    return int(m["step"]) if m else -1


def _order_key(p: Location) -> tuple[int, int, int]:
    m = _STEP_NAME.match(p.name)
    try:
        mtime = p.stat().st_mtime_ns
    except OSError:  # removed meanwhile (e.g. max_keep_ckpts); loading it will be skipped
        mtime = 0
    return (1, int(m["step"]), mtime) if m else (0, 0, mtime)


def list_checkpoints(
    ckpt_dir: PathLike | RemotePath, suffix: str | tuple[str, ...] = CHECKPOINT_SUFFIX
) -> list[Location]:
    """List the complete checkpoints of ``ckpt_dir`` that a run can resume from, newest first.

    Candidates are the ``*.pth`` files, except temporary files of writes in progress (or
    killed), ``best_*.pth`` files and published files (``<name>-<8 hex digits>.pth``). Names of the form
    ``<kind>_<N>.pth``
    (``epoch_3.pth``, ``iter_500.pth``) are ordered by ``N``, ties by modification time,
    and come before other names, which are ordered by modification time. The file named by
    ``latest`` (if it exists) comes first. A directory normally holds one kind of name; if
    it holds both ``epoch_`` and ``iter_`` files their numbers are compared as they are, and
    the ``latest`` pointer is what puts the right one first.

    Args:
        ckpt_dir: The checkpoint directory (a path, or a URL / :class:`~trainwright.checkpoint.storage.RemotePath`); a
            missing directory has no checkpoints.
        suffix: The candidates' suffix: ``.pth`` files, or e.g. ``.dcp`` for the checkpoint
            directories of sharded strategies; a tuple for several kinds.

    Returns:
        Paths of the candidates, newest first.
    """
    d = location(ckpt_dir)
    if not d.is_dir():
        return []
    found: list[Location] = sorted(
        (p for p in d.iterdir() if _is_resume_candidate(p, suffix)), key=_order_key, reverse=True
    )
    latest = read_latest(d)
    if latest is not None and _is_resume_candidate(d / latest, suffix):
        found = [d / latest] + [p for p in found if p.name != latest]
    return found


_skips: ContextVar[list[tuple[Location, str]] | None] = ContextVar("trainwright_resume_skips", default=None)


@contextmanager
def recording_skips() -> Iterator[list[tuple[Location, str]]]:
    """Collect ``(path, reason)`` of every candidate :func:`find_resumable` skips inside the block.

    The checkpoint manager wraps the strategy's ``find_resumable`` in it, so a resume can say which newer checkpoints it
    passed over and why, whatever strategy reads them.
    """
    found: list[tuple[Location, str]] = []
    token = _skips.set(found)
    try:
        yield found
    finally:
        _skips.reset(token)


def find_resumable(
    ckpt_dir: PathLike | RemotePath,
    map_location: MapLocation = "cpu",
    *,
    suffix: str | tuple[str, ...] = CHECKPOINT_SUFFIX,
    load: Callable[[Location], dict[str, Any]] | None = None,
) -> tuple[Location, dict[str, Any]] | None:
    """Load the newest checkpoint of ``ckpt_dir`` that can be read.

    Candidates come from :func:`list_checkpoints`. One that is truncated or corrupt is
    skipped with a warning naming it and the reason, and the previous one is tried.

    Args:
        ckpt_dir: The checkpoint directory.
        map_location: As for :func:`load_file`.
        suffix: As for :func:`list_checkpoints`.
        load: Reads one candidate (default: :func:`load_file`); raises
            :class:`CheckpointError` for one that is broken (a sharded strategy's loader).

    Returns:
        ``(path, checkpoint)`` of the first candidate that loads, or ``None`` when the
        directory holds no candidates (a fresh run).

    Raises:
        UnsafeCheckpointError: a candidate was refused by the safe loader; that is never
            skipped silently, since it means the directory holds files from elsewhere.
        CheckpointError: there were candidates but none could be read (resuming from
            scratch then would silently throw the run away).
    """
    failures: list[str] = []
    for path in list_checkpoints(ckpt_dir, suffix):
        try:
            return path, (load(path) if load is not None else load_file(path, map_location=map_location))
        except UnsafeCheckpointError:
            raise
        except (CheckpointError, FileNotFoundError) as e:
            failures.append(f"{path.name}: {e}")
            if (skips := _skips.get()) is not None:
                skips.append((path, str(e)))
            warnings.warn(
                f"Skipping checkpoint {str(path)!r}, it cannot be loaded ({e}); trying the previous one.",
                stacklevel=2,
            )
    if failures:
        raise CheckpointError(
            f"No checkpoint in {str(ckpt_dir)!r} can be loaded; tried:\n  "
            + "\n  ".join(failures)
            + (
                "\nRestore a checkpoint from a backup, or start a fresh run with a new work_dir."
                if not isinstance(location(ckpt_dir), RemotePath)
                else f"\nRestore a checkpoint from a backup into {ckpt_dir}, or start a fresh run with another "
                "CheckpointHook out_dir (this one keeps the broken objects)."
            )
        )
    return None
