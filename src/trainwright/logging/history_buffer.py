"""HistoryBuffer: the numbers of one logged scalar, kept by :class:`~trainwright.logging.metric_store.MetricStore`."""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any


class HistoryBuffer:
    """The recent values of one scalar, the iterations they belong to, and the global sum and count.

    Args:
        window_size: How many recent values ``median`` / ``mean`` look at by default.
        history: Keep at least this many recent values (with their iterations) for readers
            that need more than the statistics window, e.g. the logger's interval means.
    """

    def __init__(self, window_size: int = 20, history: int = 0) -> None:
        self.window_size = window_size
        maxlen = max(window_size, history)
        self._window: deque[float] = deque(maxlen=maxlen)
        self._iters: deque[int] = deque(maxlen=maxlen)
        self._sum = 0.0
        self._count = 0

    def update(self, value: float, iteration: int = -1) -> None:
        """Append a number."""
        self._window.append(value)
        self._iters.append(iteration)
        self._sum += value
        self._count += 1

    def extend(self, values: list[float], iterations: list[int]) -> None:
        """Append several numbers at once (same result as :meth:`update` on each, in order)."""
        self._window.extend(values)
        self._iters.extend(iterations)
        total = self._sum
        for v in values:
            total += v
        self._sum = total
        self._count += len(values)

    def keep(self, history: int) -> None:
        """Keep at least ``history`` recent values from now on (never fewer than before)."""
        maxlen = max(self._window.maxlen or 0, history)
        if maxlen != self._window.maxlen:
            self._window = deque(self._window, maxlen=maxlen)
            self._iters = deque(self._iters, maxlen=maxlen)

    @property
    def latest(self) -> float:
        """The most recent value."""
        return self._window[-1]

    @property
    def latest_iter(self) -> int:
        """The iteration the most recent value belongs to."""
        return self._iters[-1]

    def current(self) -> float:
        """The most recent value (mmengine's ``HistoryBuffer.current()``)."""
        return self._window[-1]

    def min(self, window: int | None = None) -> float:
        """Smallest of the last ``window`` values (``window_size`` by default)."""
        return min(self._tail(window))

    def max(self, window: int | None = None) -> float:
        """Largest of the last ``window`` values (``window_size`` by default)."""
        return max(self._tail(window))

    def history(self) -> tuple[list[int], list[float]]:
        """Every kept ``(iterations, values)``, oldest first."""
        return list(self._iters), list(self._window)

    def median(self, window: int | None = None) -> float:
        """Median of the last ``window`` values (``window_size`` by default)."""
        return statistics.median(self._tail(window))

    def mean(self, window: int | None = None) -> float:
        """Mean of the last ``window`` values (``window_size`` by default)."""
        vals = self._tail(window)
        return sum(vals) / len(vals)

    @property
    def global_avg(self) -> float:
        """Average over every value ever added."""
        return self._sum / max(self._count, 1)

    @property
    def count(self) -> int:
        """How many values were ever added."""
        return self._count

    def _tail(self, window: int | None) -> list[float]:
        return list(self._window)[-(window or self.window_size) :]

    def state_dict(self) -> dict[str, Any]:
        """Kept values, their iterations and the running totals."""
        return {
            "window": list(self._window),
            "iters": list(self._iters),
            "sum": self._sum,
            "count": self._count,
            "maxlen": self._window.maxlen,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._window = deque(state["window"], maxlen=state["maxlen"])
        self._iters = deque(state["iters"], maxlen=state["maxlen"])
        self._sum = float(state["sum"])
        self._count = int(state["count"])
