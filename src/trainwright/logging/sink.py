"""AsyncSink: one background thread that does the logging I/O, in submission order.

Formatting a log line and writing it to the console, the log file and ``metrics.jsonl``
costs ~100 µs; on an overhead-bound workload logging every 10 iterations that alone would
be several percent of the step time. The training thread therefore only builds the record
and hands it over; this thread formats and writes. :meth:`AsyncSink.flush` waits until
everything submitted is written (the trainer flushes at the end of every run and on close,
and warnings/errors are flushed at once).
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

_live: weakref.WeakSet[AsyncSink] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:  # pragma: no cover - interpreter shutdown
    for sink in list(_live):
        sink.close()


class AsyncSink:
    """Runs submitted callables on a daemon thread, in order.

    Args:
        synchronous: Run callables inline instead (for debugging, or where threads are unwelcome).
    """

    def __init__(self, synchronous: bool = False) -> None:
        self.synchronous = synchronous
        self._q: queue.SimpleQueue[tuple[Callable[..., Any] | None, tuple[Any, ...]]] = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        _live.add(self)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)``; returns at once."""
        if self.synchronous:
            fn(*args)
            return
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="trainwright-log-io", daemon=True)
            self._thread.start()
        with self._cv:
            self._pending += 1
        self._q.put((fn, args))

    def _run(self) -> None:
        while True:
            fn, args = self._q.get()
            if fn is None:
                return
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - reported by flush()
                self._error = e
            with self._cv:
                self._pending -= 1
                if self._pending == 0:
                    self._cv.notify_all()

    def flush(self) -> None:
        """Block until everything submitted so far has run; re-raise an I/O error if one happened."""
        if self._thread is not None and threading.current_thread() is not self._thread:
            with self._cv:
                while self._pending and self._thread.is_alive():
                    self._cv.wait(timeout=1.0)
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"Writing logs failed: {err!r}") from err

    def close(self) -> None:
        """Flush and stop the thread."""
        self.flush()
        if self._thread is not None and self._thread.is_alive():
            self._q.put((None, ()))
            self._thread.join(timeout=5.0)
        self._thread = None
