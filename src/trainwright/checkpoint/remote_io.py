"""Checkpoints on a :class:`~trainwright.checkpoint.storage.Store`: :func:`publish_with_fallback`, and
:func:`save_remote` for one file.

A file or folder is written locally first, then published; one that cannot be published is kept in the
store's ``fallback_dir`` with a warning (checkpoints, sharded directories), or stays where it is (copies of logs).
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainwright.checkpoint.io import MapLocation, atomic_save, load_file
from trainwright.checkpoint.storage import Location, RemotePath


def fallback_folder(target: RemotePath) -> Path:
    """Where a checkpoint of ``target``'s store is kept when it cannot be published: the store's ``fallback_dir``,
    else ``./checkpoints_unuploaded``."""
    return target.store.fallback_dir or Path.cwd() / "checkpoints_unuploaded"


def kept_path(target: RemotePath) -> Path:
    """Where ``target`` is kept when it cannot be published: ``fallback_folder(target) / target.name``."""
    return fallback_folder(target) / target.name


def keep_locally(
    local: Path,
    target: RemotePath,
    reason: BaseException | str,
    *,
    move: bool = True,
    what: str = "checkpoint",
    then: str | None = None,
    stacklevel: int = 3,
) -> Path:
    """The one fallback of a publish that failed: keep ``local`` (a file or folder) and warn, naming where it is.

    Args:
        local: The complete file or folder that could not be published.
        target: Where it should have gone.
        reason: The store's error (explained by the store) or a sentence saying what failed.
        move: Move ``local`` to :func:`kept_path` (an older copy there is replaced); False: it stays where it is.
        what: Named in the warning ("checkpoint", "the logs").
        then: Said after the warning's first sentence; None: a checkpoint's advice (``latest`` still names the
            previous one; copy it there, or resume from the kept copy).

    Returns:
        Where it is kept.
    """
    kept = local
    if move and local != kept_path(target):
        kept = kept_path(target)
        kept.parent.mkdir(parents=True, exist_ok=True)
        old = kept.with_name(f".{kept.name}.tmp.{os.getpid()}.old")  # an older copy goes aside first, then away
        if kept.exists():
            os.replace(kept, old)
        shutil.move(str(local), kept)
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
    if then is None:
        copy = f"aws s3 cp {'--recursive ' if kept.is_dir() else ''}{kept} {target.url}"
        then = (
            f"Training goes on; `latest` in {target.parent.url} still names the previous checkpoint. Copy the "
            f"{'folder' if kept.is_dir() else 'file'} there once the storage is back (e.g. `{copy}`), or resume from "
            f"it with resume={str(kept)!r}."
        )
    explained = reason if isinstance(reason, str) else target.store.explain(reason)
    warnings.warn(
        f"Could not upload {what} {target.url} ({explained}); kept it locally as {kept}. {then}".rstrip(),
        stacklevel=stacklevel,
    )
    return kept


def publish_with_fallback(
    local: Path, target: RemotePath, *, keep: bool = True, what: str = "checkpoint", then: str | None = None
) -> Location:
    """Publish the local file or folder ``local`` as ``target``; if that fails, :func:`keep_locally`.

    A folder is published file by file (its hidden files, e.g. DCP's ``.metadata``, last). Single-file
    checkpoints and the logger's copies go through it; sharded checkpoint directories, whose ranks publish
    their own files, go through :func:`keep_locally` when that fails.

    Args:
        local: The file or folder written locally.
        target: Where it goes in its store.
        keep: On failure move ``local`` into the store's fallback folder (``work_dir/checkpoints_unuploaded``);
            False: it stays where it is (a copy of the logs: the run folder keeps them).
        what: Named in the warning ("checkpoint", "logs").
        then: Said after the warning's first sentence (what still holds, how to recover); None: a checkpoint's.

    Returns:
        Where it is now: ``target``, or the local file or folder that holds it.
    """
    try:
        if local.is_dir():
            files = sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: (p.name.startswith("."), str(p)))
            for f in files:
                (target / f.relative_to(local).as_posix()).upload(f)
        else:
            target.upload(local)
    except Exception as e:  # noqa: BLE001 - any storage error: keep it here instead
        return keep_locally(local, target, e, move=keep, what=what, then=then, stacklevel=4)
    return target


def after_published(target: RemotePath, after: Callable[[], None] | None, stacklevel: int = 3) -> None:
    """Run ``after`` (the ``latest`` pointer, keep-k deletions) once ``target`` is complete; its failure only warns."""
    if after is None:
        return
    try:
        after()
    except Exception as e:  # noqa: BLE001 - the checkpoint itself is safe; say what is stale
        warnings.warn(
            f"Checkpoint {target.url} was uploaded, but updating `latest` / deleting old checkpoints failed "
            f"({target.store.explain(e)}); resume=True continues from the checkpoint `latest` still names, the next "
            f"save moves it on; to continue from this one, pass resume='{target.url}'.",
            stacklevel=stacklevel,
        )


def save_remote(obj: Mapping[str, Any], target: RemotePath, after: Callable[[], None] | None = None) -> Location:
    """``torch.save`` ``obj`` to ``target`` of a store: one object (complete or absent), published with
    :func:`publish_with_fallback`; then ``after``.

    The checkpoint is serialised into a local temporary file first (``TMPDIR``), then published.
    If that fails (the endpoint went away, after the store's own tries), the file is kept in the
    store's ``fallback_dir`` (``work_dir/checkpoints_unuploaded``) with a warning naming it, and
    ``after`` (the ``latest`` pointer, keep-k deletions) does not run: ``latest`` and the older
    checkpoints stay as they were and training goes on. An error of ``after`` is a warning too.

    Returns:
        Where the checkpoint is: ``target``, or the local file it was kept in.
    """
    import tempfile

    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.upload.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        atomic_save(obj, tmp)
        where = publish_with_fallback(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    if where != target:
        return where
    after_published(target, after)
    return target


def load_remote(src: RemotePath, map_location: MapLocation) -> dict[str, Any]:
    """Fetch ``src`` into a temporary file and load that (:func:`~trainwright.checkpoint.load_file`); messages name
    its URL."""
    return load_file(src, map_location)
