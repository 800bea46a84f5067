"""The storage protocol: :class:`Store` (where checkpoints are published) and :class:`RemotePath` (a path that carries
its store).

Implementations: :class:`~trainwright.checkpoint.fsspec_store.FsspecStore` (a URL) and
:class:`~trainwright.checkpoint.local_store.LocalStore` (a folder); :mod:`trainwright.checkpoint.storage` decides which
a path is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable

#: ``scheme://`` at the start of a URL.
URL_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://")


@runtime_checkable
class Store(Protocol):
    """Where a run's checkpoints (and copies of its logs) are published: what the checkpoint code asks of a storage.

    Paths are strings under :attr:`url` joined by ``/``. An object is published whole: a reader sees
    the old content or the new one. :class:`FsspecStore` (object storage) and :class:`LocalStore` (a
    folder) implement it; a store of your own passed as ``out_dir`` (``Trainer(checkpoint=dict(out_dir=store))``)
    is used the same way. ``fallback_dir`` is where a checkpoint that could not be published is kept
    (the checkpoint manager sets it: ``work_dir/checkpoints_unuploaded``).
    """

    url: str
    fallback_dir: Path | None
    checked: bool

    def info(self, url: str) -> Mapping[str, Any] | None:
        """``{"type": "file" | "directory", "size": int, "mtime": float}`` of ``url``; None when it does not exist."""
        ...

    def list(self, url: str) -> list[Mapping[str, Any]]:
        """The entries of the folder ``url`` (each as :meth:`info` plus its full ``"name"``); [] for a missing one."""
        ...

    def read(self, url: str) -> bytes:
        """The content of the object ``url`` (FileNotFoundError when missing)."""
        ...

    def write(self, url: str, data: bytes) -> None:
        """Publish ``data`` as the object ``url`` (complete or absent)."""
        ...

    def publish(self, local: Path, url: str) -> None:
        """Publish the local file ``local`` as the object ``url`` (complete or absent)."""
        ...

    def fetch(self, url: str, local: Path) -> None:
        """Copy the object ``url`` into the local file ``local``."""
        ...

    def remove(self, url: str) -> None:
        """Delete the object or folder ``url`` with everything under it; a missing one is fine."""
        ...

    def check(self, purpose: str = "checkpoints") -> None:
        """Raise an OSError naming the store, what is wrong and the fix when it cannot be written; sets ``checked``."""
        ...

    def explain(self, e: BaseException) -> str:
        """What an error of this store means and how to fix it."""
        ...


class RemotePath:
    """A file or folder of a :class:`Store`, addressed by its path string (a URL); the ``pathlib`` subset the checkpoint
    code needs.

    It offers the few ``pathlib`` operations the checkpoint code uses (``/``, ``name``,
    ``parent``, ``exists``, ``iterdir``...). ``str()`` is the URL. It has no ``__fspath__``:
    local file functions refuse it, so nothing opens it as a local file by accident (a local
    folder named ``s3:``).
    """

    __slots__ = ("store", "url", "_info")

    def __init__(self, store: Store, url: str, info: Mapping[str, Any] | None = None) -> None:
        self.store = store
        self.url = url.rstrip("/")
        self._info = info

    # -- names --------------------------------------------------------------------------
    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(self.store, f"{self.url}/{str(name).strip('/')}")

    @property
    def name(self) -> str:  # noqa: D102
        return self.url.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:  # noqa: D102
        return Path(self.name).suffix

    @property
    def stem(self) -> str:  # noqa: D102
        return Path(self.name).stem

    @property
    def parent(self) -> RemotePath:  # noqa: D102
        return RemotePath(self.store, self.url.rsplit("/", 1)[0])

    def with_name(self, name: str) -> RemotePath:  # noqa: D102
        return self.parent / name

    def is_absolute(self) -> bool:  # noqa: D102
        return True

    # -- queries ------------------------------------------------------------------------
    def _details(self) -> Mapping[str, Any] | None:
        if self._info is None:
            self._info = self.store.info(self.url)
        return self._info

    def exists(self) -> bool:  # noqa: D102
        return self._details() is not None

    def is_file(self) -> bool:  # noqa: D102
        info = self._details()
        return info is not None and info.get("type") == "file"

    def is_dir(self) -> bool:  # noqa: D102
        info = self._details()
        return info is not None and info.get("type") == "directory"

    def stat(self) -> SimpleNamespace:
        """``st_mtime_ns`` (0 where the store keeps none, e.g. an S3 prefix) and ``st_size``."""
        info = self._details() or {}
        mtime = info.get("LastModified") or info.get("mtime") or info.get("created") or info.get("updated")
        stamp = float(mtime.timestamp()) if mtime is not None and hasattr(mtime, "timestamp") else float(mtime or 0)
        return SimpleNamespace(st_mtime_ns=int(stamp * 1e9), st_size=int(info.get("size") or 0))

    def iterdir(self) -> Iterator[RemotePath]:
        """The entries of this folder (with their details, so queries on them cost no request); fresh from the store."""
        return iter([RemotePath(self.store, str(info["name"]), info) for info in self.store.list(self.url)])

    # -- content ------------------------------------------------------------------------
    def read_bytes(self) -> bytes:  # noqa: D102
        return self.store.read(self.url)

    def read_text(self, encoding: str = "utf-8") -> str:  # noqa: D102
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        """Publish ``data`` as this object (complete or absent)."""
        self.store.write(self.url, data)
        self._info = None

    def write_text(self, text: str, encoding: str = "utf-8") -> None:  # noqa: D102
        self.write_bytes(text.encode(encoding))

    def upload(self, local: Path) -> None:
        """Publish the local file ``local`` as this path (one object, complete or absent)."""
        self.store.publish(local, self.url)
        self._info = None

    def download(self, local: Path) -> None:
        """Copy this object into the local file ``local``."""
        self.store.fetch(self.url, local)

    def remove(self) -> None:
        """Delete this object, or this folder with everything under it; a missing one is fine."""
        self.store.remove(self.url)
        self._info = None


Location = Path | RemotePath
"""Where a checkpoint (file or folder) lives."""
