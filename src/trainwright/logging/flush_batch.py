"""FlushBatch: the rows one flush of the :class:`~trainwright.logging.metric_store.MetricStore` takes, turned into
    numbers.

The pending rows' tensors are converted in one device→host transfer per device, the rows'
timestamps become each iteration's ``data_time`` and ``time`` (:func:`derive_times`), and
this process's first non-finite loss is noted. Under several processes the batch's numbers
travel in the :class:`~trainwright.logging.agreement.Agreement`'s collective
(:meth:`FlushBatch.message`) and come back reduced (:meth:`FlushBatch.reduce`). Nothing here
keeps state between flushes or decides anything.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

import torch

#: One recorded iteration: ``(iteration, values, t_start, t_end)``; the timestamps are None
#: for values recorded without timing (:meth:`MetricStore.update_dict`).
Row = tuple[int, Mapping[str, Any], float | None, float | None]


def _columns(pending: list[Row]) -> tuple[dict[str, tuple[list[int], list[Any]]], list[float]]:
    """Pending rows → per name ``(iterations, refs)`` and the converted numbers.

    A ref is an index into the returned numbers or, for a plain number, the float itself.
    Every tensor is converted in one device→host transfer per device.
    """
    keys = list(pending[0][1])
    n = len(pending)
    if sum([len(row[1]) for row in pending]) == len(keys) * n:
        # The usual case: every iteration logged the same scalar tensors. One stack, one transfer.
        try:
            flat = [row[1][name] for name in keys for row in pending]
            stacked = torch.stack(flat)
        except (KeyError, TypeError, RuntimeError):  # other keys, plain numbers, several devices
            stacked = None
        if stacked is not None and stacked.ndim == 1:
            iters = [row[0] for row in pending]
            numbers = stacked.float().tolist()
            return {name: (iters, list(range(k * n, (k + 1) * n))) for k, name in enumerate(keys)}, numbers
    tensors: list[torch.Tensor] = []
    columns: dict[str, tuple[list[int], list[Any]]] = {}
    for it, values, _, _ in pending:
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


class FlushBatch:
    """Rows taken from the pending list for one flush: their numbers per name, their times and this process's first
    non-finite loss."""

    __slots__ = ("rows", "iters", "data", "total", "columns", "bad", "local", "names")

    def __init__(self, rows: list[Row], iters: list[int], data: list[float], total: list[float]) -> None:
        self.rows = rows
        self.iters = iters
        self.data = data
        self.total = total
        self.columns: dict[str, tuple[list[int], list[float]]] = {}
        self.bad: tuple[int, str] | None = None  # (iteration, name) of this process's first non-finite loss
        self.local: dict[str, tuple[list[int], list[float]]] = {}  # this process's own numbers, kept when bad
        self.names = ""  # what the fingerprint covers, for the error message

    def convert(self, check: bool) -> None:
        """Turn the rows' values into numbers per name (one device→host transfer per device); ``check``: note this
        process's first non-finite loss."""
        if not self.rows:
            return
        with torch.no_grad():  # a logged loss may still carry its (spent) graph: read it, don't extend it
            refs_by_name, numbers = _columns(self.rows)
        bad: tuple[int, str] | None = None
        for name, (iters, refs) in refs_by_name.items():
            vals = [numbers[r] if type(r) is int else r for r in refs]
            self.columns[name] = (iters, vals)
            if check and "loss" in name and not all(map(math.isfinite, vals)):
                first = next(i for i, v in zip(iters, vals) if not math.isfinite(v))
                if bad is None or first < bad[0]:
                    bad = (first, name)
        if bad is not None:  # this process's own numbers, for the error message
            self.bad = bad
            self.local = {name: (iters, list(vals)) for name, (iters, vals) in self.columns.items()}

    def message(self) -> tuple[list[float], int]:
        """What the agreement's collective carries of this batch: the numbers (names in order, then the times) and a
        fingerprint of the names and counts."""
        self.names = "\0".join(f"{name}:{len(vals)}" for name, (_, vals) in self.columns.items())
        flat: list[float] = []
        for _, vals in self.columns.values():
            flat.extend(vals)
        flat.extend(self.data)
        flat.extend(self.total)
        return flat, zlib.crc32(f"{self.names}|{len(self.data)}".encode())

    def reduce(self, body: torch.Tensor) -> None:
        """Replace this process's numbers, in place, by every process's ``[world, n]`` reduced: ``data_time`` the
        maximum, the rest the mean."""
        n_data = len(self.data)
        split = body.shape[1] - 2 * n_data
        mean = body.mean(0).tolist()
        k = 0
        for _, vals in self.columns.values():
            vals[:] = mean[k : k + len(vals)]
            k += len(vals)
        self.data = body[:, split : split + n_data].amax(0).tolist()
        self.total = mean[split + n_data :]


def derive_times(
    rows: list[Row], starts: Mapping[int, float], prev_end: float | None, untimed_to: int
) -> tuple[list[int], list[float], list[float], float | None]:
    """``data_time`` (previous end → start) and ``time`` (previous end → end) of the timed rows, with their iterations.

    Args:
        rows: The rows taken, in order.
        starts: Row index → when the clock (re)started before that row (``len(rows)``: after the last).
        prev_end: End of the last timed iteration before these rows; None: not timing.
        untimed_to: Iterations up to this one get no times (the timer's warm-up); the clock runs on.

    Returns:
        ``(iterations, data_times, times, prev_end)``; ``prev_end`` is where the next rows' clock starts.
    """
    prev = prev_end
    iters: list[int] = []
    data: list[float] = []
    total: list[float] = []
    for k, (it, _, t0, t1) in enumerate(rows):
        prev = starts.get(k, prev)
        if prev is None or t0 is None or t1 is None:
            continue
        if it <= untimed_to:  # warm-up: the clock runs on, no times for it
            prev = t1
            continue
        iters.append(it)
        data.append(t0 - prev)
        total.append(t1 - prev)
        prev = t1
    return iters, data, total, starts.get(len(rows), prev)
