""":class:`LocalStore`: a :class:`~trainwright.checkpoint.store.Store` on a local folder (files complete or absent)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainwright.checkpoint.store import RemotePath


class LocalStore:
    """A :class:`Store` on a local folder: files written under a temporary name and renamed, so each is complete or
    absent.

    Paths are the folder's own (``str(path)`` is a local path). A checkpoint folder given as a plain path
    stays a ``Path`` (the local code, with the folder's lock); a ``LocalStore`` is for a store with the remote
    behaviour (publish, keep a copy in ``fallback_dir`` on failure), e.g. a mounted share, or a subclass in a test.

    Args:
        root: The folder (created on the first write).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.url = str(Path(root).absolute()).rstrip("/")
        self.fallback_dir: Path | None = None
        self.checked = False

    @property
    def root(self) -> RemotePath:
        """The store's root as a path."""
        return RemotePath(self, self.url)

    def info(self, url: str) -> Mapping[str, Any] | None:  # noqa: D102
        try:
            st = os.stat(url)
        except (FileNotFoundError, NotADirectoryError):
            return None
        kind = "directory" if Path(url).is_dir() else "file"
        return {"name": url, "type": kind, "size": st.st_size, "mtime": st.st_mtime}

    def list(self, url: str) -> list[Mapping[str, Any]]:  # noqa: D102
        if not Path(url).is_dir():
            return []
        return [info for p in sorted(Path(url).iterdir()) if (info := self.info(str(p))) is not None]

    def read(self, url: str) -> bytes:  # noqa: D102
        return Path(url).read_bytes()

    def write(self, url: str, data: bytes) -> None:  # noqa: D102
        target = Path(url)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def publish(self, local: Path, url: str) -> None:  # noqa: D102
        self.write(url, Path(local).read_bytes())

    def fetch(self, url: str, local: Path) -> None:  # noqa: D102
        import shutil

        shutil.copyfile(url, local)

    def remove(self, url: str) -> None:  # noqa: D102
        import shutil

        p = Path(url)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)

    def check(self, purpose: str = "checkpoints") -> None:
        """Create the folder and write and delete a probe file in it.

        Raises:
            OSError: naming the folder, what is wrong and the fix.
        """
        probe = Path(self.url) / f".trainwright-write-check-{secrets.token_hex(4)}"
        try:
            probe.parent.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as e:
            raise OSError(
                f"Cannot write to {self.url} ({purpose}): {self.explain(e)}. Nothing was trained or written."
            ) from e
        self.checked = True

    def free_bytes(self, url: str) -> int | None:
        """Free bytes on the disk of ``url`` (its nearest existing folder): what the checkpoint preflight compares with
        the checkpoints a run keeps (:mod:`trainwright.checkpoint.retention`)."""
        import shutil

        p = Path(url)
        while not p.exists() and p != p.parent:
            p = p.parent
        return shutil.disk_usage(p).free

    def explain(self, e: BaseException) -> str:  # noqa: D102
        return f"{type(e).__name__}: {e}. Check that the folder exists, is writable and has free space"
