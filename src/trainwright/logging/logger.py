"""A rank-aware standard ``logging.Logger`` per trainer (no module-level singleton)."""

from __future__ import annotations

import itertools
import logging
import sys
from pathlib import Path

_ids = itertools.count()


def create_logger(name: str = "trainwright", log_file: str | Path | None = None, level: str | int = "INFO", rank: int = 0) -> logging.Logger:
    """A logger writing to stdout and ``log_file`` on rank 0; warnings and errors only elsewhere.

    Each call returns a fresh logger (unique name) so two trainers never share handlers.
    """
    logger = logging.getLogger(f"{name}.{next(_ids)}")
    logger.propagate = False
    logger.setLevel(level if rank == 0 else logging.WARNING)
    fmt = logging.Formatter("%(asctime)s - trainwright - %(levelname)s - %(message)s", "%m/%d %H:%M:%S")
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    logger.addHandler(console)
    if log_file is not None and rank == 0:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(log_file, encoding="utf-8")
        fh.setFormatter(fmt)
        logger.addHandler(fh)
    return logger


def close_logger(logger: logging.Logger) -> None:
    """Close and detach the logger's handlers."""
    for h in list(logger.handlers):
        h.close()
        logger.removeHandler(h)
