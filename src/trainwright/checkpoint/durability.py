"""Background fsyncs: a checkpoint is in place at once and durable a little later; a failed fsync is never lost.

:func:`~trainwright.checkpoint.io.atomic_write` with ``durable=False`` renames the finished file into place and hands
its fsyncs (the file, then its directory) to one background thread (:func:`fsync_later`). :func:`when_durable` runs
work (deleting older checkpoints) only after every fsync handed over before it succeeded; :func:`wait_durable` waits
for them and raises the first failure. The interpreter waits for the thread at exit, and an error nobody waited for
is reported on stderr then.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path


class DurabilityError(OSError):
    """A file is complete and in place, but its fsync failed: a power loss or an OS crash could lose it."""


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename in ``directory`` durable; a no-op where directories cannot be opened or fsynced."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows cannot open directories; its renames are durable enough.
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory (EINVAL)
        pass
    finally:
        os.close(fd)


def _fsync_file(fd: int, target: Path) -> None:
    """fsync ``fd`` (an open descriptor of ``target``, which owns it), then ``target``'s directory."""
    try:
        os.fsync(fd)
    except OSError as e:
        reason = e.strerror or str(e)
        raise DurabilityError(
            e.errno,
            f"fsync of {target} failed ({reason}): the file is complete and in place (a killed process leaves it "
            "whole), but the disk did not confirm it, so a power loss or OS crash could lose it. Older checkpoints "
            "were kept (they are deleted only after a newer one is durable). Check the disk (free space, `dmesg` for "
            "I/O errors), then save again or continue with resume=True",
            str(target),
        ) from e
    finally:
        os.close(fd)
    fsync_dir(target.parent)


class _Pending:
    """The process's queue of background fsyncs and of the work waiting for them; one thread while it is not empty."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: deque[tuple[bool, Callable[[], None]]] = deque()  # (is an fsync, the work)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._at_exit = False

    def put(self, job: Callable[[], None], *, fsync: bool) -> bool:
        """Queue ``job`` behind the fsyncs in flight; False (nothing queued) when none is in flight."""
        with self._cond:
            if not fsync and self._thread is None:
                return False
            self._jobs.append((fsync, job))
            if self._thread is None:
                if not self._at_exit:
                    atexit.register(self._report_at_exit)
                    self._at_exit = True
                # not a daemon: the interpreter waits for it at exit, so the fsyncs are done before the process ends
                self._thread = threading.Thread(target=self._run, name="checkpoint-fsync", daemon=False)
                self._thread.start()
            return True

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs:
                    self._thread = None
                    self._cond.notify_all()
                    return
                is_fsync, job = self._jobs.popleft()
                if not is_fsync and self._error is not None:
                    continue  # never delete older checkpoints after a failed fsync
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - handed to the next wait_durable()
                with self._cond:
                    if self._error is None:
                        self._error = e
                    else:
                        logging.getLogger("trainwright").error(f"{e} (after an earlier error: {self._error})")

    def failed(self) -> bool:
        """Whether an error is waiting to be raised."""
        with self._cond:
            return self._error is not None

    def wait(self) -> None:
        with self._cond:
            if self._thread is threading.current_thread():
                return  # work queued behind the fsyncs asked: it runs after them already
            while self._thread is not None:
                self._cond.wait()
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _report_at_exit(self) -> None:
        try:
            self.wait()
        except BaseException as e:  # noqa: BLE001 - nobody is left to raise it to
            print(f"trainwright: {e}", file=sys.stderr)

    def reset(self) -> None:
        """In a forked child: the parent's thread and queue are the parent's."""
        self._cond = threading.Condition()
        self._jobs.clear()
        self._thread, self._error = None, None


_PENDING = _Pending()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_PENDING.reset)


def fsync_later(fd: int, target: Path) -> None:
    """Hand the open descriptor ``fd`` of ``target`` (already renamed into place) to the background thread.

    The thread fsyncs it, closes it and fsyncs ``target``'s directory; a failure is raised by
    the next :func:`wait_durable`.
    """
    _PENDING.put(lambda: _fsync_file(fd, target), fsync=True)


def when_durable(work: Callable[[], None]) -> None:
    """Run ``work`` once every fsync handed to the background thread so far has succeeded: now if none is in flight.

    Queued, it runs in the background thread; it is skipped when an fsync failed (that error
    is raised by the next :func:`wait_durable`), as it is when one failed and was not waited for yet.
    An error ``work`` raises in the thread is raised by the next :func:`wait_durable` too.
    """
    if _PENDING.put(work, fsync=False) or _PENDING.failed():
        return
    work()


def wait_durable() -> None:
    """Block until every background fsync (and the work waiting for it) is done; raise the first error, once.

    The wait points of a run: before the next checkpoint is written, at the end of training,
    ``Trainer.close()`` (the strategy's ``wait_for_checkpoint``); and process exit.

    Raises:
        DurabilityError: an fsync failed (the message names the file and what to do).
        OSError: work waiting for the fsyncs failed (deleting an older checkpoint).
    """
    _PENDING.wait()
