"""MetricStore: windowed scalars that stay tensors until someone needs a number.

The training loop hands it each iteration's log tensors (losses, grad norm). They are
kept as tensors - no ``.item()``, no host-device sync - and turned into numbers in one
batch when :meth:`MetricStore.flush` runs (the logger hook at its interval, the loops at
epoch ends, or automatically every ``flush_every`` updates to bound memory). ``flush`` is
also where a non-finite loss is detected, naming the iteration it first appeared in.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

import torch


class HistoryBuffer:
    """The recent values of one scalar plus its global sum and count.

    Args:
        window_size: How many recent values ``median`` / ``mean`` look at.
    """

    def __init__(self, window_size: int = 20) -> None:
        self._window: deque[float] = deque(maxlen=window_size)
        self._iters: deque[int] = deque(maxlen=window_size)
        self._sum = 0.0
        self._count = 0

    def update(self, value: float, iteration: int = -1) -> None:
        """Append a number."""
        self._window.append(value)
        self._iters.append(iteration)
        self._sum += value
        self._count += 1

    @property
    def latest(self) -> float:
        """The most recent value."""
        return self._window[-1]

    @property
    def latest_iter(self) -> int:
        """The iteration the most recent value belongs to."""
        return self._iters[-1]

    def median(self, window: int | None = None) -> float:
        """Median of the last ``window`` values (the whole window by default)."""
        return statistics.median(self._tail(window))

    def mean(self, window: int | None = None) -> float:
        """Mean of the last ``window`` values (the whole window by default)."""
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
        vals = list(self._window)
        return vals[-window:] if window else vals

    def state_dict(self) -> dict[str, Any]:
        """Window contents and running totals."""
        return {"window": list(self._window), "iters": list(self._iters), "sum": self._sum, "count": self._count, "maxlen": self._window.maxlen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._window = deque(state["window"], maxlen=state["maxlen"])
        self._iters = deque(state["iters"], maxlen=state["maxlen"])
        self._sum = float(state["sum"])
        self._count = int(state["count"])


class MetricStore:
    """Named :class:`HistoryBuffer` s fed with tensors that are converted lazily.

    Args:
        window_size: Window of each buffer (median/mean over the last N values).
        flush_every: Convert pending tensors after this many iterations at the latest,
            so memory stays bounded even when no logger asks for numbers.
        raise_on_nonfinite: On flush, raise :class:`FloatingPointError` when a value whose
            name contains ``"loss"`` is NaN or infinite.
    """

    def __init__(self, window_size: int = 20, flush_every: int = 100, raise_on_nonfinite: bool = True) -> None:
        self.window_size = window_size
        self.flush_every = flush_every
        self.raise_on_nonfinite = raise_on_nonfinite
        self._buffers: dict[str, HistoryBuffer] = {}
        self._pending: list[tuple[int, dict[str, Any]]] = []

    # -- hot path -------------------------------------------------------------------------
    def update_dict(self, values: dict[str, Any], iteration: int) -> None:
        """Record one iteration's named values (tensors or numbers); no host sync."""
        self._pending.append((iteration, values))
        if len(self._pending) >= self.flush_every:
            self.flush()

    def update_scalar(self, name: str, value: float, iteration: int = -1) -> None:
        """Record a plain Python number right away (timings, learning rates)."""
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = HistoryBuffer(self.window_size)
        buf.update(value, iteration)

    # -- sync point -----------------------------------------------------------------------
    def flush(self) -> None:
        """Turn every pending tensor into a number, in one transfer per device.

        Raises:
            FloatingPointError: a loss was NaN/Inf (``raise_on_nonfinite``); the message
                names the first such iteration and that iteration's loss dict.
        """
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        # One device→host transfer per device: stack every pending tensor, then .tolist().
        flat: list[torch.Tensor] = []
        refs: list[tuple[int, str, Any]] = []
        for it, values in pending:
            for name, v in values.items():
                if isinstance(v, torch.Tensor):
                    refs.append((it, name, len(flat)))
                    flat.append(v if v.ndim == 0 else v.detach().float().mean())
                else:
                    refs.append((it, name, float(v)))
        numbers = self._to_numbers(flat)
        values_of = [(it, name, numbers[r] if type(r) is int else r) for it, name, r in refs]
        bad_iter = None
        buffers = self._buffers
        for it, name, val in values_of:
            buf = buffers.get(name)
            if buf is None:
                buf = buffers[name] = HistoryBuffer(self.window_size)
            buf.update(val, it)
            if bad_iter is None and "loss" in name and not math.isfinite(val) and self.raise_on_nonfinite:
                bad_iter = it
        if bad_iter is not None:
            losses = {n: v for i, n, v in values_of if i == bad_iter}
            raise FloatingPointError(
                f"Loss became infinite or NaN at iteration {bad_iter}: {losses}. "
                "Lower the learning rate, enable gradient clipping (optim_wrapper=dict(clip_grad=dict(max_norm=1.0))), "
                "check the data for NaN/Inf, or pass nonfinite_loss='skip' to the Trainer to skip such steps."
            )

    @staticmethod
    def _to_numbers(tensors: list[torch.Tensor]) -> list[float]:
        """Floats of scalar tensors, with one transfer per device."""
        if not tensors:
            return []
        try:
            return torch.stack(tensors).float().tolist()
        except RuntimeError:  # tensors on several devices (or dtypes stack refuses): group them
            out: list[float] = [0.0] * len(tensors)
            groups: dict[torch.device, list[int]] = {}
            for i, t in enumerate(tensors):
                groups.setdefault(t.device, []).append(i)
            for idx in groups.values():
                for i, v in zip(idx, torch.stack([tensors[i].float() for i in idx]).tolist()):
                    out[i] = v
            return out

    # -- reading --------------------------------------------------------------------------
    def get(self, name: str) -> HistoryBuffer:
        """The buffer of ``name`` (flush first if you need the latest tensors counted)."""
        return self._buffers[name]

    def __contains__(self, name: str) -> bool:
        return name in self._buffers

    def names(self) -> list[str]:
        """All names with at least one number."""
        return list(self._buffers)

    def latest(self) -> dict[str, float]:
        """The latest number of every scalar (flushing pending tensors first)."""
        self.flush()
        return {k: b.latest for k, b in self._buffers.items()}

    def state_dict(self) -> dict[str, Any]:
        """Every buffer (pending tensors are flushed first)."""
        self.flush()
        return {k: b.state_dict() for k, b in self._buffers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the buffers saved by :meth:`state_dict`."""
        self._pending = []
        self._buffers = {}
        for k, s in state.items():
            b = HistoryBuffer(self.window_size)
            b.load_state_dict(s)
            self._buffers[k] = b
