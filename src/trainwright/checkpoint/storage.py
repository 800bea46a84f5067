"""Where checkpoints live: a local folder (:class:`~pathlib.Path`) or a path of a :class:`Store` (:class:`RemotePath`).

:func:`location` decides once per path: a local path stays a ``Path``; a URL becomes a :class:`RemotePath` on a new
:class:`FsspecStore`; a :class:`Store` (e.g. a :class:`LocalStore`, or one written by a user) is its root. A path
carries its store: nothing is registered per process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwright.checkpoint.local_store import LocalStore
from trainwright.checkpoint.store import URL_SCHEME, Location, RemotePath, Store
from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.checkpoint.fsspec_store import FsspecStore
    from trainwright.checkpoint.fsspec_store import FsspecStore as RemoteStore

__all__ = [
    "FsspecStore",
    "LocalStore",
    "Location",
    "RemotePath",
    "RemoteStore",
    "Store",
    "fsspec_store",
    "is_url",
    "local_path",
    "location",
    "remove",
]

#: Loaded on first use (a run on local disk never needs it); ``RemoteStore`` is the former name of
#: :class:`FsspecStore` (kept for code that names it).
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())


def is_url(path: object) -> bool:
    """True for a URL that is not a local path: ``s3://...``, ``memory://...`` (a ``file://`` URL is local)."""
    if not isinstance(path, str):
        return isinstance(path, (RemotePath, Store))
    m = URL_SCHEME.match(path)
    return m is not None and m["scheme"].lower() != "file"


def location(
    path: str | os.PathLike[str] | RemotePath | Store,
    storage_options: Mapping[str, Any] | None = None,
    *,
    within: Location | None = None,
) -> Path | RemotePath:
    """``path`` as a :class:`RemotePath` (a URL, a :class:`Store`) or a ``Path`` (a local path, or a ``file://`` URL).

    A URL under ``within`` (the checkpoint folder of a trainer, a :class:`RemotePath`) is a path of
    that folder's store, so it keeps that store's ``storage_options``; otherwise a new
    :class:`FsspecStore` reads its credentials and endpoint from ``storage_options`` or the environment
    (s3fs: ``AWS_ACCESS_KEY_ID`` ..., ``AWS_ENDPOINT_URL``). Nothing is shared between calls.

    Raises:
        ImportError: the URL's fsspec backend is not installed (names the extra to install).
    """
    if isinstance(path, RemotePath):
        return path
    if isinstance(path, Store):
        return RemotePath(path, path.url)
    if isinstance(path, str):
        m = URL_SCHEME.match(path)
        if m is not None:
            if m["scheme"].lower() == "file":
                return Path(path[len(m[0]) :])
            url = path.rstrip("/")
            if storage_options is None and isinstance(within, RemotePath):
                root = within.store.url
                if url == root or url.startswith(root + "/"):
                    return RemotePath(within.store, url)
            from trainwright.checkpoint.fsspec_store import FsspecStore

            return FsspecStore(url, storage_options).root
    return Path(path)


def remove(path: str | os.PathLike[str] | RemotePath) -> None:
    """Delete a checkpoint: a file, or a folder with everything under it (a sharded checkpoint), local or in its
    store; a missing one is fine."""
    loc = location(path)
    if isinstance(loc, RemotePath):
        loc.remove()
    elif loc.is_dir():
        import shutil

        shutil.rmtree(loc, ignore_errors=True)
    else:
        loc.unlink(missing_ok=True)


def local_path(path: str | os.PathLike[str] | RemotePath, who: str = "this strategy") -> Path:
    """``path`` as a local ``Path``; a store's path (a URL) is a ValueError naming ``who`` and the fix."""
    loc = location(path)
    if isinstance(loc, RemotePath):
        raise ValueError(
            f"{loc}: {who} reads and writes checkpoints on local disk only. Give a local folder as the checkpoint "
            "out_dir "
            "(and copy it to object storage yourself), or use strategy='fsdp' / 'ddp'"
        )
    return loc


def fsspec_store(path: RemotePath, who: str = "strategy='fsdp'") -> FsspecStore:
    """The :class:`FsspecStore` of ``path``; a store of another kind is a ValueError (sharded checkpoints go through
    DCP's fsspec writer)."""
    from trainwright.checkpoint.fsspec_store import FsspecStore

    if not isinstance(path.store, FsspecStore):
        raise ValueError(
            f"{path}: {who} writes sharded checkpoints through DCP's fsspec writer, which needs an fsspec URL (s3://, "
            "memory://...) "
            f"as out_dir, not a {type(path.store).__name__}. Give an fsspec URL or a local folder"
        )
    return path.store
