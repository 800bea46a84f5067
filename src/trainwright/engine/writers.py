"""detectron2's event writers (``detectron2.utils.events``) over trainwright's writers.

``PeriodicWriter([CommonMetricPrinter(max_iter), JSONWriter(path)], period=20)`` writes what
the storage holds; the JSON lines go through :class:`~trainwright.logging.JsonlWriter` (whole
lines only: a full disk costs lines, never a torn one).
"""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path
from typing import Any

import torch

from trainwright.engine.events import get_event_storage
from trainwright.logging import JsonlWriter

__all__ = ["CommonMetricPrinter", "EventWriter", "JSONWriter"]


class EventWriter:
    """Base class of writers that read the current :class:`~trainwright.engine.EventStorage` (``write``) and release
    files (``close``)."""

    def write(self) -> None:
        """Write what the storage holds now."""
        raise NotImplementedError(f"{type(self).__name__} must implement write()")

    def close(self) -> None:
        """Release files; nothing is written afterwards."""


class JSONWriter(EventWriter):
    """Append one JSON object per iteration, ``{"iteration": i, <name>: value, ...}``, to ``json_file``.

    Each write covers the iterations whose latest values are newer than the previous write;
    a value put with ``smoothing_hint=True`` is the median over ``window_size``, as in detectron2.

    Args:
        json_file: The file (created with its folder; appended to).
        window_size: The median's window.
    """

    def __init__(self, json_file: str | os.PathLike[str], window_size: int = 20) -> None:
        self._out = JsonlWriter(Path(json_file), flush_secs=0.0)
        self._window_size = window_size
        self._last_write = -1

    def write(self) -> None:  # noqa: D102
        by_iter: dict[int, dict[str, Any]] = {}
        for name, (value, it) in get_event_storage().latest_with_smoothing_hint(self._window_size).items():
            if it > self._last_write:
                by_iter.setdefault(it, {})[name] = value
        if by_iter:
            self._out.write_many([{"iteration": it, **by_iter[it]} for it in sorted(by_iter)])
            self._last_write = max(by_iter)

    def close(self) -> None:  # noqa: D102
        self._out.close()


class CommonMetricPrinter(EventWriter):
    """Log one line of training progress: ETA, iteration, losses (medians), times (window means), lr, peak memory.

    The line has detectron2's fields, e.g. ``eta: 0:00:08  iter: 19  total_loss: 0.1234
    loss_cls: 0.1  time: 0.0950  data_time: 0.0012  lr: 0.01  max_mem: 812M`` (``iter`` 0-based,
    ``max_mem`` on CUDA only), logged with ``logger.info``.

    Args:
        max_iter: The run's iterations, for the ETA (None: no ETA).
        window_size: The window of the medians and means.
        logger: Where lines go (default: the ``trainwright.engine`` logger).
    """

    def __init__(
        self, max_iter: int | None = None, window_size: int = 20, logger: logging.Logger | None = None
    ) -> None:
        self.logger = logger or logging.getLogger("trainwright.engine")
        self._max_iter = max_iter
        self._window_size = window_size

    def write(self) -> None:  # noqa: D102
        storage = get_event_storage()
        it = storage.iter
        if self._max_iter is not None and it >= self._max_iter:
            return  # after a finished run (after_train's write): progress only, nothing new to show
        histories = storage.histories()
        w = self._window_size
        parts = [f"iter: {it}"]
        if self._max_iter is not None and "time" in histories:
            parts.insert(
                0, f"eta: {datetime.timedelta(seconds=int(histories['time'].avg(w) * (self._max_iter - it - 1)))}"
            )
        parts += [f"{k}: {h.median(w):.4g}" for k, h in histories.items() if "loss" in k]
        parts += [f"{k}: {histories[k].avg(w):.4f}" for k in ("time", "data_time") if k in histories]
        if "lr" in histories:
            parts.append(f"lr: {histories['lr'].latest():.5g}")
        if torch.cuda.is_available():
            parts.append(f"max_mem: {torch.cuda.max_memory_allocated() / 2**20:.0f}M")
        self.logger.info("  ".join(parts))
