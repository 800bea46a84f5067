"""Write checkpoints in a background thread so training only waits for a copy to host memory.

The loop waits for the **snapshot** (every tensor copied to CPU memory: the next optimizer step
changes them in place). The **write** (serialise, temporary file, fsync, rename, then the
``latest`` pointer and keep-k deletions) runs in a writer thread in that order, so the
synchronous path's promises hold: complete or absent, ``latest`` names a complete file, old
files go only after the new one is complete. At most one write is in flight (a run that saves
faster than the disk slows to the disk's pace); :meth:`AsyncCheckpointWriter.wait` waits for
it and re-raises its error: call it before the process exits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from trainwright.checkpoint.io import atomic_save


def snapshot(obj: Any) -> Any:
    """A copy of ``obj`` whose tensors are CPU copies that no later training step can change.

    Containers are rebuilt (dicts keep their type for ``OrderedDict`` state dicts and their
    ``_metadata``); non-tensor leaves are shared (they are immutable or rebuilt by the
    ``state_dict()`` calls that produced them).
    """
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
    if isinstance(obj, Mapping):
        out: Any = type(obj)() if type(obj) is not dict and _default_constructible(type(obj)) else {}
        for k, v in obj.items():
            out[k] = snapshot(v)
        meta = getattr(obj, "_metadata", None)
        if meta is not None:
            out._metadata = meta  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list):
        return [snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(snapshot(v) for v in obj)
    return obj


def _default_constructible(cls: type) -> bool:
    try:
        cls()
    except Exception:  # noqa: BLE001 - any failure means "use a plain dict"
        return False
    return True


class AsyncCheckpointWriter:
    """One background thread at a time that writes a snapshot and then runs follow-up work.

    Example::

        writer = AsyncCheckpointWriter()
        writer.submit(state, "ckpt/iter_100.pth", after=lambda: write_latest("ckpt", "iter_100.pth"))
        ...                       # training goes on while the file is written
        writer.wait()             # before exiting: the file is on disk, errors re-raised
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_path: Path | None = None

    @property
    def pending(self) -> bool:
        """True while a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(
        self, state: Mapping[str, Any], path: str | Path, after: Callable[[], None] | None = None, copy: bool = True,
        write: Callable[[Mapping[str, Any], Any], object] | None = None,
    ) -> None:
        """Wait for the previous write, snapshot ``state`` and write it to ``path`` in the background.

        Args:
            state: The checkpoint dict (may share tensors with the live model).
            path: Target file, written atomically.
            after: Runs in the writer thread once the file is complete (pointer update,
                deleting old checkpoints); skipped if the write failed.
            copy: Snapshot the tensors first (set False only if ``state`` is already a
                private copy).
            write: Writes the snapshot to ``path`` in the thread (default :func:`atomic_save`;
                a remote checkpoint's upload, whose ``path`` is a URL object, is another).

        Raises:
            BaseException: the previous write's error, if it failed.
        """
        self.wait()
        data = snapshot(state) if copy else state
        target = Path(path) if write is None else path
        self._thread = threading.Thread(target=self._write, args=(data, target, after, write), name=f"checkpoint-writer:{getattr(target, 'name', target)}", daemon=False)
        self._thread.start()

    def _write(self, data: Mapping[str, Any], path: Any, after: Callable[[], None] | None, write: Callable[[Mapping[str, Any], Any], object] | None = None) -> None:
        try:
            (write or atomic_save)(data, path)
            self.last_path = path
            if after is not None:
                after()
        except BaseException as e:  # noqa: BLE001 - handed to the training thread by wait()
            self._error = e

    def wait(self) -> None:
        """Block until the pending write (if any) is complete; re-raise its error."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if isinstance(error, OSError):
            raise error  # names the file, says nothing was replaced and what to do (atomic_write)
        if error is not None:
            raise RuntimeError(f"Writing a checkpoint in the background failed: {error}. The previous complete checkpoint is still on disk; check free space and permissions of the checkpoint directory.") from error
