"""A rank-aware standard ``logging.Logger`` per trainer (no module-level singleton)."""

from __future__ import annotations

import itertools
import logging
import re
import sys
import time
import warnings
import weakref
from pathlib import Path
from typing import TextIO

from trainwright.logging.append import AppendFile

_ids = itertools.count()


class _TeeHandler(logging.Handler):
    """Formats each record once and writes it to the console and (optionally) a file.

    The console is flushed per record (people watch it); the file is written at most once a
    second, at every warning and on flush / close, whole lines at a time
    (:class:`~trainwright.logging.append.AppendFile`: a full disk costs lines, with a
    warning naming the file, never a torn line or the run), and holds no descriptor between writes.
    """

    def __init__(self, stream: TextIO, log_file: str | Path | None) -> None:
        super().__init__()
        self.stream = stream
        self.file: AppendFile | None = AppendFile(log_file, "log lines") if log_file is not None else None
        self._last_flush = 0.0

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D102
        self.emit_many([record])

    def emit_many(self, records: list[logging.LogRecord]) -> None:
        """Write several records with one console write and flush (and one file write)."""
        try:
            self._write("".join([self.format(r) + "\n" for r in records]), max(r.levelno for r in records))
        except Exception:  # noqa: BLE001 - logging must never break training
            self.handleError(records[-1])

    def write_lines(self, msgs: list[str], created: list[float], level: int) -> None:
        """Write plain messages as this handler's formatter would render their records."""
        fmt = self.formatter
        if not isinstance(fmt, _Formatter):  # someone set their own formatter: go through records
            self.emit_many([_record("trainwright", level, m, t) for m, t in zip(msgs, created)])
            return
        name = logging.getLevelName(level)
        try:
            self._write("".join([fmt.line(t, name, m) + "\n" for m, t in zip(msgs, created)]), level)
        except Exception:  # noqa: BLE001 - logging must never break training
            self.handleError(_record("trainwright", level, msgs[-1], created[-1]))

    def _write(self, text: str, level: int) -> None:
        self.stream.write(text)
        self.stream.flush()
        if self.file is not None:
            self.file.write(text)
            now = time.monotonic()
            if now - self._last_flush >= 1.0 or level >= logging.WARNING:
                self._last_flush = now
                self.file.flush()

    def flush(self) -> None:  # noqa: D102
        self.stream.flush()
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:  # noqa: D102
        if self.file is not None:
            self.file.flush()
            self.file = None
        super().close()


class _Formatter(logging.Formatter):
    """``<time> - trainwright - <LEVEL> - <message>``, with the timestamp rendered once per second."""

    _cache: tuple[int, str] = (-1, "")

    def __init__(self) -> None:
        super().__init__("%(asctime)s - trainwright - %(levelname)s - %(message)s", "%m/%d %H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:  # noqa: D102 - same output as the format string, without its machinery
        if record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        return self.line(record.created, record.levelname, record.getMessage())

    def line(self, created: float, levelname: str, msg: str) -> str:
        """One rendered line: what the format string gives for such a record (no exception text)."""
        return f"{self.format_time(created)} - trainwright - {levelname} - {msg}"

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        return self.format_time(record.created)

    def format_time(self, created: float) -> str:
        """The timestamp of a record created at ``created`` (``time.time()``), cached per second."""
        sec = int(created)
        if self._cache[0] != sec:
            self._cache = (sec, time.strftime(self.datefmt or "%m/%d %H:%M:%S", self.converter(created)))
        return self._cache[1]


def create_logger(
    name: str = "trainwright", log_file: str | Path | None = None, level: str | int = "INFO", rank: int = 0
) -> logging.Logger:
    """A logger writing to stdout and ``log_file`` on rank 0; elsewhere errors, and the warnings that name that rank.

    Every rank trains the same run (compared at ``train()`` start), so a warning about the run
    is rank 0's to print; the other ranks printing it too would show each one once per process.
    A warning about one process names its rank (``"... on this process (rank 1) ..."``) and is
    printed by that rank. On a rank other than 0 this also installs :func:`rank_zero_warnings`
    (the same rule for Python warnings) for the process.
    Each call returns a fresh logger (unique name) so two trainers never share handlers.
    """
    logger = logging.getLogger(f"{name}.{next(_ids)}")
    logger.propagate = False
    logger.setLevel(level if rank == 0 else logging.WARNING)
    if rank != 0:
        rank_zero_warnings(rank)
    if log_file is not None and rank == 0:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        Path(log_file).touch()  # the run's log exists from the start, even before its first line
    handler = _TeeHandler(sys.stdout, log_file if rank == 0 else None)
    if handler.file is not None:
        global _run_log
        _run_log = weakref.ref(handler)  # trainwright's Python warnings go into this run's log too
        rank_zero_warnings(0)
    handler.setFormatter(_Formatter())
    if rank != 0:
        handler.addFilter(lambda r: r.levelno >= logging.ERROR or _names_rank(r.getMessage(), rank))
    logger.addHandler(handler)
    return logger


def rank_zero_warnings(rank: int) -> None:
    """On rank ``rank`` (not 0), stop printing the Python warnings trainwright's own code emits, unless they name this
    rank; on rank 0, also write them to the run's log.

    A warning trainwright gives about the run (a scheduler that never applies, a config key
    that is not used, ...) is the same on every rank; rank 0 prints it, once. A warning about
    one process names its rank (``"rank 1 was given seed ..."``) and is printed by that rank.
    Warnings of other code (torch, the user's) are untouched, and so is recording them
    (``warnings.catch_warnings(record=True)``, ``pytest.warns``). Installed once per process
    (``warnings.showwarning``, which it wraps); a later call only updates the rank.
    """
    current = warnings.showwarning
    if getattr(current, "trainwright_rank", None) is not None:
        current.trainwright_rank = rank  # type: ignore[attr-defined]
        return

    def showwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        own_rank = showwarning.trainwright_rank  # type: ignore[attr-defined]
        ours = _emitted_by_trainwright()
        if ours and own_rank != 0 and not _names_rank(str(message), own_rank):
            return
        if ours:
            _to_run_log(str(message))
        current(message, category, filename, lineno, file, line)

    showwarning.trainwright_rank = rank  # type: ignore[attr-defined]
    warnings.showwarning = showwarning


#: The console-and-file handler of the rank-0 logger built last: trainwright's Python warnings are written to its file
#: too.
_run_log: weakref.ref[_TeeHandler] | None = None


def _to_run_log(message: str) -> None:
    """Append a warning line to the current run's ``train.log`` (not the console: the warning prints itself there)."""
    handler = _run_log() if _run_log is not None else None
    if handler is None or handler.file is None or not isinstance(handler.formatter, _Formatter):
        return
    try:
        handler.file.write(handler.formatter.line(time.time(), "WARNING", message) + "\n")
        handler.file.flush()
    except Exception:  # noqa: BLE001 - a warning must never break training
        pass


def _names_rank(message: str, rank: int) -> bool:
    """Whether ``message`` is about process ``rank``: it says ``rank N`` (not ``rank N0``...)."""
    return re.search(rf"\brank {rank}\b", message) is not None


def _emitted_by_trainwright() -> bool:
    """Whether the code that called ``warnings.warn`` (the first frame outside this module and ``warnings``) is
    trainwright's."""
    frame = sys._getframe(2)  # noqa: SLF001 - the caller of showwarning's caller; no public way to the emitting frame
    while frame is not None and frame.f_code.co_filename in (__file__, warnings.__file__):
        frame = frame.f_back  # type: ignore[assignment]
    return frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] == "trainwright"


def close_logger(logger: logging.Logger) -> None:
    """Close and detach the logger's handlers, and forget the logger (each trainer's is unique)."""
    for h in list(logger.handlers):
        h.close()
        logger.removeHandler(h)
    logging.Logger.manager.loggerDict.pop(logger.name, None)


def log_lines(
    logger: logging.Logger, msgs: list[str], level: int = logging.INFO, created: list[float] | None = None
) -> None:
    """Log several messages at once: one write per trainwright handler, ordinary records for others.

    No caller lookup (a stack walk) per line, as ``logger.info`` would do: for batches of
    lines rendered together, e.g. the training log lines of the logger hook. ``created``
    (``time.time()`` values) dates each line when it was produced rather than when written.
    """
    if not msgs or not logger.isEnabledFor(level):
        return
    when = created if created is not None else [time.time()] * len(msgs)
    records: list[logging.LogRecord] | None = None
    for handler in logger.handlers:
        if level < handler.level:
            continue
        if isinstance(handler, _TeeHandler) and not handler.filters:
            with handler.lock:  # type: ignore[union-attr]
                handler.write_lines(msgs, when, level)
        else:
            if records is None:
                records = [_record(logger.name, level, m, t) for m, t in zip(msgs, when)]
            for r in records:
                handler.handle(r)


def _record(name: str, level: int, msg: str, created: float) -> logging.LogRecord:
    r = logging.LogRecord(name, level, "", 0, msg, None, None)
    r.created = created
    r.msecs = (created - int(created)) * 1000
    return r


def console_stream(logger: logging.Logger) -> TextIO | None:
    """The stream the logger's console handler writes to (``sys.stdout`` as it was at creation), or None."""
    for h in logger.handlers:
        if isinstance(h, _TeeHandler):
            return h.stream
    return None


def set_console_stream(logger: logging.Logger, stream: TextIO) -> None:
    """Send the logger's console output to ``stream`` (e.g. through a live progress display); the log file is
    unchanged."""
    for h in logger.handlers:
        if isinstance(h, _TeeHandler):
            h.stream = stream
