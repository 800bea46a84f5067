"""PendingLines: training log lines asked for but not written yet, turned into records when they are written.

The logger hook holds one :class:`LineRequest` per logging iteration (no numbers yet: the
store's tensors are converted at its next flush); :meth:`PendingLines.write`, called after a
flush (by the logger hook, the train loop's agreement point, ``Trainer.flush_logs``), builds
each line's record from the metric store's buffers - the mean of every loss and of the times
over the line's interval, the latest other values - and hands them to every writer at once
(through :class:`~trainwright.logging.writers.Writers`: a writer that raises costs nothing else).
"""

from __future__ import annotations

import bisect
import time
import warnings
from typing import Any, NamedTuple

from trainwright.logging.flops import FLOPS_KEYS, StepFlops
from trainwright.logging.log_processor import CustomStat, LogProcessor
from trainwright.logging.metric_store import MetricStore
from trainwright.logging.writers import LineInfo, Writer, Writers

__all__ = ["CustomStat", "LineRequest", "PendingLines"]

_TIME_KEYS = ("time", "data_time")


class LineRequest(NamedTuple):
    """What a training record needs that is only known at its iteration."""

    line: LineInfo
    iteration: int
    epoch: int
    lr: dict[str, list[float]]  # OptimWrapper.get_lr() at that iteration
    grad_norm: Any  # a tensor (converted when the record is built) or None
    loss_scale: float | None
    since: int  # iteration of the previous line: this line's means cover (since, iteration]
    samples: int | None  # samples in this iteration's batch (this process), None: unknown
    tokens: Any  # tokens in it (a number, a tensor converted later, or None)
    memory: float | None  # peak device memory allocated during the line's training iterations on this process, MiB
    extra: dict[str, float] | None = (
        None  # values known at the line only (mmengine's message-hub ``train/`` scalars): logged as they are
    )


class PendingLines:
    """The held training lines of a run, written to ``writers`` from ``store``'s numbers.

    Args:
        store: Where the lines' numbers are (flushed before :meth:`write`).
        writers: The trainer's writers (empty on every process but the main one: lines are dropped there);
            a plain list is wrapped in a :class:`~trainwright.logging.writers.Writers`.
        processes: Processes of the run (throughput counts every process's batch).
        processor: How records average and which statistics they add (default: each line's own
            iterations, no custom statistics); the logger hook may give its own at :meth:`start`.

    Attributes:
        last_write: ``time.perf_counter()`` of the last :meth:`write` (or :meth:`start`).
        written_to: Iteration of the last written line (or where training started).
    """

    def __init__(
        self,
        store: MetricStore,
        writers: Writers | list[Writer],
        processes: int = 1,
        processor: LogProcessor | None = None,
    ) -> None:
        self.store = store
        self.writers: Writers = writers if isinstance(writers, Writers) else Writers(writers)
        self._default = processor if processor is not None else LogProcessor()
        self._processor = self._default
        self.processes = processes
        self.last_write = 0.0
        self.written_to = 0
        self._held: list[LineRequest] = []
        self._warned_short = False  # warned once that a line's values had left the store's history

    @property
    def flops(self) -> StepFlops | None:
        """The latest FLOP count of one training iteration in the store (None: not counted, no ``tflops`` / ``mfu``).

        The ``flops`` hook records it into the metric store (:data:`~trainwright.logging.flops.FLOPS_KEYS`)
        once per ``train()``; each line uses the count recorded at or before its iteration.
        """
        return self._flops_at(None)

    def _flops_at(self, iteration: int | None) -> StepFlops | None:
        """The count recorded at or before ``iteration`` (None: the latest), from the store's flushed values."""
        found = []
        for name in FLOPS_KEYS:
            if name not in self.store:
                return None
            iters, values = self.store.get(name).history()
            b = len(iters) if iteration is None else bisect.bisect_right(iters, iteration)
            if b == 0:
                return None
            found.append(values[b - 1])
        flops, samples, peak = found
        return StepFlops(int(flops), int(samples) or None, peak or None) if flops else None

    @property
    def processor(self) -> LogProcessor:
        """How this training run's records average and which statistics they add (mmengine's ``log_processor``)."""
        return self._processor

    @property
    def window_size(self) -> int | None:
        """Losses and times are averaged over this many iterations ending at each line (None: the line's own); the
        processor's."""
        return self._processor.window_size

    @property
    def custom(self) -> tuple[CustomStat, ...]:
        """More numbers per record (``log_processor.custom_cfg``); the processor's."""
        return self._processor.custom

    def start(
        self, iteration: int, processor: LogProcessor | None = None, line_every: int = 0, epoch_len: int = 0
    ) -> None:
        """A training run starts at ``iteration``: nothing held, the clock of :attr:`last_write` restarts.

        Args:
            iteration: Where training starts (the first line averages from there).
            processor: This run's log processor (None: the one the lines were built with).
            line_every: Iterations between lines (0: lines not written by an interval). With it,
                the store keeps enough history for a line held until the next agreement point:
                lines are due at least every ``flush_every`` iterations and written at the latest
                at the next agreement point, when the oldest held line's values must still be there.
            epoch_len: Iterations per epoch (for an ``"epoch"`` custom statistic's window).
        """
        self._processor = processor if processor is not None else self._default
        if line_every:
            store = self.store
            store.keep_history(
                store.flush_every + store.agreement.every + 2 * line_every + self._processor.history(epoch_len)
            )
        self._held = []
        self.written_to = iteration
        self.last_write = time.perf_counter()

    def hold(self, request: LineRequest) -> None:
        """Keep a line until the next :meth:`write`."""
        self._held.append(request)

    def write(self) -> None:
        """Build the held lines' records from the store's buffers (flushed by the caller) and hand them to every
        writer."""
        requests, self._held = self._held, []
        self.last_write = time.perf_counter()
        if not requests:
            return
        self.written_to = requests[-1].iteration
        if not self.writers:  # not the main process
            return
        records = self._records(requests)
        self.writers.write_train(records, [r.line for r in requests])

    def write_eval(self, record: dict[str, Any]) -> None:
        """Hand an evaluation record to every writer (the held training lines should be written first, in order)."""
        self.writers.write_eval(record)

    def _records(self, requests: list[LineRequest]) -> list[dict[str, Any]]:
        """Per request: loss and time means over its interval and the latest other values, from the store."""
        store = self.store
        cols = []
        for name in store.names():
            if name.startswith("val") or name in FLOPS_KEYS:
                continue
            buf = store.get(name)
            iters, values = buf.history()
            dropped = buf.count > len(iters)  # older values left the buffer (it keeps the newest ones)
            if iters and min(iters) < 0:  # numbers recorded without an iteration belong to no line
                values = [v for i, v in zip(iters, values) if i >= 0]
                iters = [i for i in iters if i >= 0]
            cols.append((name, iters, values, "loss" in name or name in _TIME_KEYS, dropped))
        out = []
        for r in requests:
            hi = r.iteration
            lo = self._processor.window_start(r.since, hi)
            record: dict[str, Any] = {"mode": "train", "epoch": r.epoch, "iter": hi}
            times: dict[str, float] = {}
            for name, iters, values, mean, dropped in cols:
                a, b = bisect.bisect_right(iters, lo), bisect.bisect_right(iters, hi)
                if mean and dropped and a == 0 and (not iters or iters[0] > lo + 1) and not self._warned_short:
                    self._warned_short = True
                    warnings.warn(
                        f"LoggerHook: the line of iteration {hi} should average {name!r} over iterations "
                        f"{lo + 1}..{hi}, but the "
                        f"oldest value the metric store still holds is of iteration {iters[0] if iters else 'none'}: "
                        "the others left "
                        "its history before the line was written (lines were held too long for the store's buffers), "
                        "so this line "
                        "and possibly later ones average fewer values or lack the key. Raise "
                        "trainer.metric_store.window_size (each "
                        "buffer keeps at least that many values) or keep metric_store.flush_every small.",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                if b > a:
                    v = sum(values[a:b]) / (b - a) if mean else values[b - 1]
                    if name in _TIME_KEYS:
                        times[name] = v
                    else:
                        record[name] = v
            for k, lrs in r.lr.items():
                record[k] = lrs[0]
            if r.grad_norm is not None:
                record["grad_norm"] = float(r.grad_norm)
            if r.loss_scale is not None:
                record["loss_scale"] = r.loss_scale
            if "time" in times:
                record["time"] = times["time"]
                record["data_time"] = times.get("data_time", 0.0)
                self._throughput(record, r, times["time"])
            if r.memory is not None:
                record["max_memory_mb"] = r.memory
            if r.extra:
                record.update({k: v for k, v in r.extra.items() if k not in record})
            record.update(self._processor.custom_values(store, hi, r.since, r.line.batch))
            out.append(record)
        return out

    def _throughput(self, record: dict[str, Any], r: LineRequest, seconds: float) -> None:
        """The line's throughput from the logged batch and the mean iteration time.

        ``samples_per_s`` / ``tokens_per_s``: the batch's counts × processes / time. ``tflops``
        (per device): the counted iteration's FLOPs, scaled by this batch's samples over the
        counted batch's, / time; ``mfu``: ``tflops`` / the peak, when the peak is known.
        """
        if seconds <= 0:
            return
        if r.samples is not None:
            record["samples_per_s"] = r.samples * self.processes / seconds
        if r.tokens is not None:
            record["tokens_per_s"] = float(r.tokens) * self.processes / seconds
        flops = self._flops_at(r.iteration)
        if flops is not None:
            tflops = record["tflops"] = flops.tflops(r.samples, seconds)
            if flops.peak_tflops:
                record["mfu"] = tflops / flops.peak_tflops
