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
from collections.abc import Callable
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

    def extend(self, values: list[float], iterations: list[int]) -> None:
        """Append several numbers at once (same result as :meth:`update` on each, in order)."""
        self._window.extend(values)
        self._iters.extend(iterations)
        total = self._sum
        for v in values:
            total += v
        self._sum = total
        self._count += len(values)

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


def _columns(pending: list[tuple[int, dict[str, Any]]]) -> tuple[dict[str, tuple[list[int], list[Any]]], list[float]]:
    """Pending ``(iteration, values)`` rows → per name ``(iterations, refs)`` and the converted numbers.

    A ref is an index into the returned numbers or, for a plain number, the float itself.
    Every tensor is converted in one device→host transfer per device.
    """
    keys = list(pending[0][1])
    n = len(pending)
    if sum([len(vals) for _, vals in pending]) == len(keys) * n:
        # The usual case: every iteration logged the same scalar tensors. One stack, one transfer.
        try:
            flat = [vals[name] for name in keys for _, vals in pending]
            stacked = torch.stack(flat)
        except (KeyError, TypeError, RuntimeError):  # other keys, plain numbers, several devices
            stacked = None
        if stacked is not None and stacked.ndim == 1:
            iters = [it for it, _ in pending]
            numbers = stacked.float().tolist()
            return {name: (iters, list(range(k * n, (k + 1) * n))) for k, name in enumerate(keys)}, numbers
    tensors: list[torch.Tensor] = []
    columns: dict[str, tuple[list[int], list[Any]]] = {}
    for it, values in pending:
        for name, v in values.items():
            entry = columns.get(name)
            if entry is None:
                entry = columns[name] = ([], [])
            entry[0].append(it)
            if isinstance(v, torch.Tensor):
                entry[1].append(len(tensors))
                tensors.append(v if v.ndim == 0 else v.detach().float().mean())
            else:
                entry[1].append(float(v))
    return columns, _to_numbers(tensors)


def _to_numbers(tensors: list[torch.Tensor]) -> list[float]:
    """Floats of scalar tensors, with one transfer per device."""
    if not tensors:
        return []
    try:
        return torch.stack(tensors).float().tolist()  # type: ignore[no-any-return]
    except RuntimeError:  # tensors on several devices (or dtypes stack refuses): group them
        out: list[float] = [0.0] * len(tensors)
        groups: dict[torch.device, list[int]] = {}
        for i, t in enumerate(tensors):
            groups.setdefault(t.device, []).append(i)
        for idx in groups.values():
            for i, v in zip(idx, torch.stack([tensors[i].float() for i in idx]).tolist()):
                out[i] = v
        return out


#: What listeners receive: per name, the iterations and the numbers recorded since the last flush.
Columns = dict[str, tuple[list[int], list[float]]]


class MetricStore:
    """Named :class:`HistoryBuffer` s fed with tensors that are converted lazily.

    Pseudocode of the life of a logged value::

        update_dict({"loss": t}, it)      # hot path: a list append, the tensor stays on the device
        ...
        flush()                           # drains run (the timer hands over its timestamps),
                                          # pending tensors → numbers (one transfer per device),
                                          # buffers extended, listeners get the new columns,
                                          # then a NaN/Inf loss raises FloatingPointError

    Args:
        window_size: Window of each buffer (median/mean over the last N values).
        flush_every: Convert pending tensors after this many iterations at the latest,
            so memory stays bounded whoever asks for numbers.
        raise_on_nonfinite: On flush, raise :class:`FloatingPointError` when a value whose
            name contains ``"loss"`` is NaN or infinite.
    """

    def __init__(self, window_size: int = 20, flush_every: int = 1000, raise_on_nonfinite: bool = True) -> None:
        self.window_size = window_size
        self.flush_every = flush_every
        self.raise_on_nonfinite = raise_on_nonfinite
        self._buffers: dict[str, HistoryBuffer] = {}
        self._pending: list[tuple[int, dict[str, Any]]] = []
        self._fresh: Columns = {}
        self._drains: list[Callable[[], None]] = []
        self._listeners: list[Callable[[Columns, bool], None]] = []

    # -- hot path -------------------------------------------------------------------------
    def update_dict(self, values: dict[str, Any], iteration: int) -> None:
        """Record one iteration's named values (tensors or numbers); no host sync."""
        self._pending.append((iteration, values))
        if len(self._pending) >= self.flush_every:
            self.flush(urgent=False)

    def hot_path(self) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """``(rows, limit)`` for a producer that records every iteration (the train loop).

        ``rows.append((iteration, values))`` is :meth:`update_dict` without its Python call;
        once ``len(rows) >= limit`` the producer calls ``flush(urgent=False)``. ``rows`` stays
        the same list object for the life of the store.
        """
        return self._pending, self.flush_every

    def update_scalar(self, name: str, value: float, iteration: int = -1) -> None:
        """Record a plain Python number right away (timings, learning rates)."""
        self.update_scalars(name, [value], [iteration])

    def update_scalars(self, name: str, values: list[float], iterations: list[int]) -> None:
        """Record several numbers of one scalar at once (what drains use)."""
        if not values:
            return
        self.buffer(name).extend(values, iterations)
        col = self._fresh.get(name)
        if col is None:
            self._fresh[name] = (list(iterations), list(values))
        else:
            col[0].extend(iterations)
            col[1].extend(values)

    def buffer(self, name: str) -> HistoryBuffer:
        """The buffer of ``name``, created empty if it does not exist yet."""
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = HistoryBuffer(self.window_size)
        return buf

    def add_drain(self, fn: Callable[[], None]) -> None:
        """Have ``fn`` called at the start of every :meth:`flush` (once, however often added).

        For producers that batch numbers up cheaply on the hot path (the iteration timer keeps
        raw timestamps) and hand them over with :meth:`update_scalars` when someone reads.
        """
        if fn not in self._drains:
            self._drains.append(fn)

    def add_listener(self, fn: Callable[[Columns, bool], None]) -> None:
        """Have ``fn(columns, urgent)`` called after every :meth:`flush` with the numbers it brought in.

        ``columns`` maps each name to ``(iterations, values)`` of everything recorded since the
        previous flush, in order (the logger hook writes its lines from them). ``urgent`` is
        False for the automatic flush that bounds memory (every ``flush_every`` updates): a
        listener may keep its output for later then; every other flush wants it written.
        """
        if fn not in self._listeners:
            self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[Columns, bool], None]) -> None:
        """Stop calling ``fn`` (no error if it was not registered)."""
        if fn in self._listeners:
            self._listeners.remove(fn)

    # -- sync point -----------------------------------------------------------------------
    def flush(self, raise_on_nonfinite: bool | None = None, urgent: bool = True) -> None:
        """Turn every pending tensor into a number, in one transfer per device.

        Args:
            raise_on_nonfinite: Override the store's setting for this call (error paths pass
                False so a second exception does not hide the first).
            urgent: Passed to the listeners: False only for the automatic memory-bounding flush.

        Raises:
            FloatingPointError: a loss was NaN/Inf; the message names the first such
                iteration and that iteration's loss dict. Listeners have seen the numbers.
        """
        for drain in self._drains:
            drain()
        pending = self._pending
        bad: tuple[int, str] | None = None
        columns: dict[str, tuple[list[int], list[Any]]] = {}
        numbers: list[float] = []
        if pending:
            pending = pending.copy()
            self._pending.clear()  # the same list: the train loop holds it (see hot_path)
            columns, numbers = _columns(pending)  # one device→host transfer per device
            check = self.raise_on_nonfinite if raise_on_nonfinite is None else raise_on_nonfinite
            for name, (iters, refs) in columns.items():
                vals = [numbers[r] if type(r) is int else r for r in refs]
                self.update_scalars(name, vals, iters)
                if check and "loss" in name and not all(map(math.isfinite, vals)):
                    first = next(i for i, v in zip(iters, vals) if not math.isfinite(v))
                    if bad is None or first < bad[0]:
                        bad = (first, name)
        fresh, self._fresh = self._fresh, {}
        if fresh:
            for fn in self._listeners:
                fn(fresh, urgent)
        if bad is not None:
            it = bad[0]
            losses = {name: (numbers[r] if type(r) is int else r) for name, (iters, refs) in columns.items() for i, r in zip(iters, refs) if i == it}
            raise FloatingPointError(
                f"Loss became infinite or NaN at iteration {it}: {losses}. "
                "Lower the learning rate, enable gradient clipping (optim_wrapper=dict(clip_grad=dict(max_norm=1.0))), "
                "check the data for NaN/Inf, or pass nonfinite_loss='skip' to the Trainer to skip such steps."
            )

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
        self._pending.clear()
        self._fresh = {}
        self._buffers = {}
        for k, s in state.items():
            b = HistoryBuffer(self.window_size)
            b.load_state_dict(s)
            self._buffers[k] = b
