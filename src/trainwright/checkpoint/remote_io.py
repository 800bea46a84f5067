"""Single-file checkpoints on an fsspec URL: :func:`save_remote` uploads one, :func:`load_remote` downloads and loads one.

Both go through a local temporary file (``TMPDIR``) and the local code of
:mod:`trainwright.checkpoint.io`; the URL itself is a :class:`~trainwright.checkpoint.storage.RemotePath`.
An upload that keeps failing leaves the checkpoint in the store's fallback folder, with a warning.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainwright.checkpoint.io import MapLocation, atomic_save, load_local
from trainwright.checkpoint.storage import Location, RemotePath


def save_remote(obj: Mapping[str, Any], target: RemotePath, after: Callable[[], None] | None = None) -> Location:
    """``torch.save`` ``obj`` to the remote ``target``: one upload (complete or absent), retried; then ``after``.

    The checkpoint is serialised into a local temporary file first (``TMPDIR``), then uploaded
    as one object. If the upload still fails after the store's tries (the endpoint went away),
    the file is kept in ``target.store.fallback_dir`` (``work_dir/checkpoints_unuploaded``) with a
    warning naming it, and ``after`` (the ``latest`` pointer, keep-k deletions) does not run:
    ``latest`` and the older checkpoints stay as they were and training goes on. An error of
    ``after`` (``latest`` could not be written) is a warning too.

    Returns:
        Where the checkpoint is: ``target``, or the local file it was kept in.
    """
    import shutil
    import tempfile

    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.upload.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        atomic_save(obj, tmp)
        try:
            target.upload(tmp)
        except Exception as e:  # noqa: BLE001 - any storage error: keep the checkpoint here instead
            fallback = target.store.local_fallback()
            fallback.mkdir(parents=True, exist_ok=True)
            kept = fallback / target.name
            shutil.move(str(tmp), kept)
            warnings.warn(
                f"Could not upload checkpoint {target.url} ({target.store.explain(e)}); kept it locally as {kept}. Training goes on; "
                f"`latest` in {target.parent.url} still names the previous checkpoint. Copy the file there once the storage is back "
                f"(e.g. `aws s3 cp {kept} {target.url}`), or resume from it with resume={str(kept)!r}.",
                stacklevel=2,
            )
            return kept
    finally:
        tmp.unlink(missing_ok=True)
    if after is not None:
        try:
            after()
        except Exception as e:  # noqa: BLE001 - the checkpoint itself is safe; say what is stale
            warnings.warn(f"Checkpoint {target.url} was uploaded, but updating `latest` / deleting old checkpoints failed ({target.store.explain(e)}); "
                          f"resume=True continues from the checkpoint `latest` still names, the next save moves it on; to continue from this one, "
                          f"pass resume='{target.url}'.", stacklevel=2)
    return target


def load_remote(src: RemotePath, map_location: MapLocation) -> dict[str, Any]:
    """Download ``src`` into a temporary file and load that; messages name the URL."""
    import tempfile

    if not src.is_file():
        raise FileNotFoundError(f"Checkpoint {src.url!r} does not exist" + (" (it is a folder)" if src.is_dir() else "") + ". Check the URL, or pass resume=True to pick the newest checkpoint of a folder.")
    with tempfile.TemporaryDirectory(prefix="trainwright-download-") as d:
        local = Path(d) / src.name
        src.download(local)
        return load_local(local, map_location, shown=src.url)
