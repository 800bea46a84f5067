"""WorkDirLock: one training run at a time per checkpoint folder.

A run holds an exclusive ``flock`` on ``<ckpt_dir>/.lock`` (a text file naming its pid, host and
start time): a second run on the same folder refuses to start, naming the holder. The kernel
releases the lock however the process ends (``kill -9`` too), so a lock file nobody holds is
stale and is taken over. Where ``fcntl`` does not exist (Windows) there is no lock.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_FILENAME = ".lock"

#: Descriptors of the locks this process holds: a forked child closes its copies (see :func:`_close_in_child`).
_HELD: set[int] = set()


def _close_in_child() -> None:
    """In a forked child (a DataLoader worker): close the inherited lock descriptors.

    ``flock`` belongs to the open file, which a fork shares: a worker that kept it would hold
    the lock after its parent was killed until it noticed (seconds), and an immediate restart
    would find the folder busy.
    """
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class WorkDirBusyError(RuntimeError):
    """Another live process is training with the same checkpoint folder."""


class WorkDirLock:
    """The lock of one checkpoint folder; :meth:`acquire` when a run starts, :meth:`release` when it ends.

    Args:
        ckpt_dir: The checkpoint folder (``work_dir/checkpoints``); created if missing.
    """

    def __init__(self, ckpt_dir: str | os.PathLike[str]) -> None:
        self.path = Path(ckpt_dir) / LOCK_FILENAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> str | None:
        """Take the lock.

        Returns:
            None, or the previous holder's record (``"pid 123 on host, since ..."``) when the
            lock was stale: that process ended without releasing it.

        Raises:
            WorkDirBusyError: a live process holds it (the message names its pid and the fix).
        """
        if fcntl is None or self._fd is not None:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                break
            if _same_file(fd, self.path):
                return self._take(fd)
            os.close(fd)  # the holder removed the file between our open and our lock: open the new one
        holder = _read(fd)
        os.close(fd)
        same = (
            " (this process: another Trainer in it is training; let it finish, or close() it)"
            if holder.startswith(f"pid {os.getpid()} ")
            else ""
        )
        raise WorkDirBusyError(
            f"Another run is training in {str(self.path.parent)!r}: "
            f"{holder or 'a process that has not written its pid yet'}{same}. "
            "Two runs on one work_dir overwrite each other's checkpoints. Wait for it to finish or stop it, "
            "or give this run another work_dir."
        )

    def _take(self, fd: int) -> str | None:
        previous = _read(fd)
        os.ftruncate(fd, 0)
        os.pwrite(
            fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0
        )
        self._fd = fd
        _HELD.add(fd)
        return previous or None

    def release(self) -> None:
        """Remove the lock file and release the lock (a no-op when not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _HELD.discard(fd)
        try:
            if _same_file(fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)  # releases the flock


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
