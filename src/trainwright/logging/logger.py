"""A rank-aware standard ``logging.Logger`` per trainer (no module-level singleton)."""

from __future__ import annotations

import itertools
import logging
import sys
import time
from pathlib import Path
from typing import TextIO

from trainwright.logging.sink import AsyncSink

_ids = itertools.count()


class _TeeHandler(logging.Handler):
    """Formats each record once and writes it to the console and (optionally) a file.

    The console is flushed per record (people watch it); the file is flushed at most once a
    second and on close, so a log line costs no extra system call on the hot path.
    """

    def __init__(self, stream: TextIO, log_file: str | Path | None, sink: AsyncSink | None = None) -> None:
        super().__init__()
        self.sink = sink
        self.stream = stream
        self.file: TextIO | None = open(log_file, "a", encoding="utf-8") if log_file is not None else None  # noqa: SIM115
        self._last_flush = 0.0

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D102
        if self.sink is None:
            self._write(record)
            return
        self.sink.submit(self._write, record)
        if record.levelno >= logging.WARNING:
            self.sink.flush()

    def _write(self, record: logging.LogRecord) -> None:
        try:
            msg = self.format(record) + "\n"
            self.stream.write(msg)
            self.stream.flush()
            if self.file is not None:
                self.file.write(msg)
                now = time.monotonic()
                if now - self._last_flush >= 1.0 or record.levelno >= logging.WARNING:
                    self.file.flush()
                    self._last_flush = now
        except Exception:  # noqa: BLE001 - logging must never break training
            self.handleError(record)

    def flush(self) -> None:  # noqa: D102
        if self.sink is not None:
            self.sink.flush()
        self.stream.flush()
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:  # noqa: D102
        if self.sink is not None:
            self.sink.flush()
        if self.file is not None:
            self.file.close()
            self.file = None
        super().close()


def create_logger(name: str = "trainwright", log_file: str | Path | None = None, level: str | int = "INFO", rank: int = 0, sink: AsyncSink | None = None) -> logging.Logger:
    """A logger writing to stdout and ``log_file`` on rank 0; warnings and errors only elsewhere.

    Each call returns a fresh logger (unique name) so two trainers never share handlers.
    With a ``sink``, formatting and writing happen on its background thread.
    """
    logger = logging.getLogger(f"{name}.{next(_ids)}")
    logger.propagate = False
    logger.setLevel(level if rank == 0 else logging.WARNING)
    if log_file is not None and rank == 0:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    handler = _TeeHandler(sys.stdout, log_file if rank == 0 else None, sink)
    handler.setFormatter(logging.Formatter("%(asctime)s - trainwright - %(levelname)s - %(message)s", "%m/%d %H:%M:%S"))
    logger.addHandler(handler)
    return logger


def close_logger(logger: logging.Logger) -> None:
    """Close and detach the logger's handlers."""
    for h in list(logger.handlers):
        h.close()
        logger.removeHandler(h)
