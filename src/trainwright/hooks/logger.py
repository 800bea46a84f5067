"""LoggerHook: a training record every ``interval`` iterations and one per evaluation, sent to every writer.

Pseudocode (what makes a log line cost ~nothing on the training hot path)::

    after_train_iter at a logging iteration:
        requests.append((it, epoch, lr, ...))                 # no numbers yet
        if metric_store.flush_if(flush_secs passed here, or flush_every iterations unwritten):
            write_lines()                                     # agreed: same iteration on every process
    write_lines: per request, loss means over its interval and the latest other values,
                 read from the store's buffers (iterations kept beside values)
                 → one records list → writer.write_train(records, lines) for each writer

Turning numbers into text is the costly part of logging (it runs on cold caches between
training steps), so lines are written together, at most once per ``flush_secs`` while
training runs fast, and right away when the previous batch is older than that (slow steps).
Each process's clock only proposes a flush; :meth:`MetricStore.flush_if` makes it a decision
shared by all processes (under several processes in the one collective of an agreement
point - a logging iteration, about ``metric_store.agree_secs`` after the previous point -
which also reduces the logged numbers over the processes: rank 0's lines show the mean loss
of all ranks and the slowest rank's ``data_time``; that collective is answered at the next
agreement point, so there the lines up to the previous one are written). Pending lines are
also written at the end of each epoch, of training and of the run (also after an error) and
before evaluation results, in order.

The hook owns no numbers: the metric store keeps them (and is checkpointed), so a resumed
run's first lines average over the same values as the uninterrupted run's.
"""

from __future__ import annotations

import bisect
import functools
import time
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.logging.throughput import batch_size, num_tokens
from trainwright.logging.writers import LineInfo
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView

_TIME_KEYS = ("time", "data_time")


class _Request(NamedTuple):
    """What a training record needs that is only known at its iteration."""

    iteration: int
    epoch: int
    batch_idx: int
    lr: dict[str, list[float]]  # OptimWrapper.get_lr() at that iteration
    created: float  # wall-clock time of the iteration (the line's timestamp)
    grad_norm: Any  # a tensor (converted when the record is built) or None
    loss_scale: float | None
    since: int  # iteration of the previous line: this line's means cover (since, iteration]
    samples: int | None  # samples in this iteration's batch (this process), None: unknown
    tokens: Any  # tokens in it (a number, a tensor converted later, or None)
    memory: float | None  # peak CUDA memory allocated so far on this process's device, MiB


_new_request = functools.partial(tuple.__new__, _Request)  # no Python-level __new__ on the hot path


@HOOKS.register
class LoggerHook(Hook):
    """Logs training scalars at an interval and validation / test metrics after each pass.

    Each training record holds the mean of every loss and of the times over the
    iterations since the previous line (``interval`` of them, fewer for an epoch's or the
    run's short tail), the latest value of other logged outputs, the learning rate, the grad
    norm, the loss scale and the throughput: ``samples_per_s`` (samples of the logged
    iteration's batch × processes / mean iteration time), ``tokens_per_s`` when the batch
    says how many tokens it holds (see :mod:`trainwright.logging.throughput`) and, on CUDA,
    ``max_memory_mb`` (``torch.cuda.max_memory_allocated`` of this process's device, MiB).
    The writers of ``trainer.writers`` show it (the console adds the ETA) or store it.

    The run's last iteration always gets a line (iteration-based: 50 iterations logged every
    20 give lines at 20, 40 and 50, the last averaging 41-50).

    Args:
        interval: Iterations between log lines.
        ignore_last: Skip the log line for an epoch's last, shorter interval (not the run's last).
        flush_secs: While training runs faster than one line per ``flush_secs``, lines are
            written in batches at most this far apart (0 writes each line at once). With
            several processes lines are written when any of them proposes it, and at the
            latest every ``metric_store.flush_every`` iterations; a logging iteration that is
            an agreement point of the store (about ``metric_store.agree_secs`` = 1 s apart)
            makes one small collective (the store's flush: the proposal, a stop request, the
            NaN check and the numbers, reduced over the processes - ``data_time`` the max,
            the rest the mean), answered at the next agreement point, and no other
            iteration makes any.
    """

    priority = "BELOW_NORMAL"

    def __init__(self, interval: int = 10, ignore_last: bool = False, flush_secs: float = 1.0) -> None:
        if interval < 1:
            raise ValueError(f"LoggerHook interval must be >= 1, got {interval}")
        if flush_secs < 0:
            raise ValueError(f"LoggerHook flush_secs must be >= 0, got {flush_secs}")
        self.interval = interval
        self.ignore_last = ignore_last
        self.flush_secs = flush_secs
        self._last_idx = -1
        self._requests: list[_Request] = []
        self._last_write = 0.0
        self._written_to = 0  # iteration of the last written line (or where training started)
        self._by_epoch = True
        self._epoch_len = 0
        self._max_iters = 0
        self._log_scale = False
        self._line_iter = 0  # iteration of the latest line (requested), or the last one before the run started
        self._processes = 1
        self._cuda: Any = None  # the CUDA device whose peak memory is logged; None on CPU
        self._warned_short = False  # warned once that a line's values had left the store's history

    # -- training ---------------------------------------------------------------------------
    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        loop = require_train_loop(trainer, "LoggerHook.before_train")
        self._by_epoch = loop.by_epoch
        self._epoch_len = len(loop.dataloader)
        self._max_iters = loop.max_iters
        # Only a float16 GradScaler has a loss scale to log (it may not exist before the first step).
        self._log_scale = getattr(getattr(trainer.optim_wrapper, "precision", None), "scaler", None) is not None
        self._last_idx = self._epoch_len - 1 if loop.by_epoch and not self.ignore_last else -1
        self._requests = []
        self._written_to = trainer.progress.iteration
        self._line_iter = self._line_at_or_before(trainer.progress.iteration)
        self._processes = trainer.strategy.world_size
        device = trainer.strategy.device
        self._cuda = device if device.type == "cuda" else None
        # Lines are due at least every flush_every iterations (see after_train_iter), so the values
        # of the oldest pending line's interval are still in the store's buffers then. Under several
        # processes the due is carried by the next agreement point and written at the one after
        # (points are at most flush_every apart, + an interval to reach a logging iteration).
        store = trainer.metric_store
        store.keep_history(3 * (store.flush_every + self.interval) if store.pipelined else store.flush_every + 2 * self.interval)
        self._last_write = time.perf_counter()
        trainer.hold_log_lines(lambda: self._write_lines(trainer))  # trainer.flush_logs() writes what is held

    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        return self.interval  # the loop calls after_train_iter at multiples of it, epoch ends and the run's last iteration only

    def after_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        it = trainer.progress.iteration
        if it % self.interval == 0 or batch_idx == self._last_idx or it == self._max_iters:
            # Runs once per interval, so its code is cold each time: keep it to reading values.
            p = trainer.progress
            ow = trainer.optim_wrapper
            scale = ow.loss_scale if self._log_scale else None
            if scale is not None:
                scale = float(scale)
            memory = torch.cuda.max_memory_allocated(self._cuda) / 2**20 if self._cuda is not None else None
            request = _new_request((
                it, p.epoch + 1 if self._by_epoch else p.epoch, batch_idx, ow.get_lr(), time.time(), getattr(ow, "grad_norm", None), scale,
                self._line_iter, batch_size(data_batch), num_tokens(data_batch), memory,
            ))
            self._line_iter = it
            store = trainer.metric_store
            due = time.perf_counter() - self._last_write >= self.flush_secs or p.iteration - self._written_to >= store.flush_every
            if store.pipelined:
                # Several processes: flush_if applies (at an agreement point) the previous point's answer,
                # which covers the lines held so far; a NaN in it raises before this iteration's line is held.
                if store.flush_if(due, iteration=it):
                    self._write_lines(trainer)
                self._requests.append(request)
            else:
                self._requests.append(request)
                if store.flush_if(due, iteration=it):
                    self._write_lines(trainer)

    def after_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self.write_pending(trainer)  # the loop flushed the store: the epoch's last lines go out now

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self.write_pending(trainer)

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        # Also after an error: the trainer flushed the store without raising; write what was logged.
        self.write_pending(trainer)
        trainer.hold_log_lines(None)

    def write_pending(self, trainer: TrainerView) -> None:
        """Flush the store (a no-op when nothing is pending) and write every line held for its batch.

        Called at the hook's own events; :meth:`Trainer.flush_logs` reaches the held lines
        through ``hold_log_lines`` (e.g. before a checkpoint is written: a resumed run does not
        log those iterations again). Call it at the same point on every process, as any store flush.
        """
        trainer.metric_store.flush()
        self._write_lines(trainer)

    def _write_lines(self, trainer: TrainerView) -> None:
        """Build the pending records from the store's buffers (just flushed) and hand them to every writer."""
        requests, self._requests = self._requests, []
        self._last_write = time.perf_counter()
        if not requests:
            return
        self._written_to = requests[-1].iteration
        if not trainer.writers:  # not the main process
            return
        records = self._records(trainer, requests)
        lines = [LineInfo(r.created, r.batch_idx + 1, self._by_epoch, self._epoch_len, self._max_iters) for r in requests]
        for w in trainer.writers:
            w.write_train(records, lines)

    def _records(self, trainer: TrainerView, requests: list[_Request]) -> list[dict[str, Any]]:
        """Per request: loss and time means over its interval and the latest other values, from the store."""
        store = trainer.metric_store
        cols = []
        for name in store.names():
            if name.startswith("val"):
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
            lo = r.since
            record: dict[str, Any] = {"mode": "train", "epoch": r.epoch, "iter": hi}
            times: dict[str, float] = {}
            for name, iters, values, mean, dropped in cols:
                a, b = bisect.bisect_right(iters, lo), bisect.bisect_right(iters, hi)
                if mean and dropped and a == 0 and (not iters or iters[0] > lo + 1) and not self._warned_short:
                    self._warned_short = True
                    warnings.warn(
                        f"LoggerHook: the line of iteration {hi} should average {name!r} over iterations {lo + 1}..{hi}, but the "
                        f"oldest value the metric store still holds is of iteration {iters[0] if iters else 'none'}: the others left "
                        "its history before the line was written (lines were held too long for the store's buffers), so this line "
                        "and possibly later ones average fewer values or lack the key. Raise trainer.metric_store.window_size (each "
                        "buffer keeps at least that many values) or keep metric_store.flush_every small.",
                        RuntimeWarning,
                        stacklevel=2,
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
            out.append(record)
        return out

    def _throughput(self, record: dict[str, Any], r: _Request, seconds: float) -> None:
        """``samples_per_s`` / ``tokens_per_s`` of the line: the logged batch's counts × processes / mean iteration time."""
        if seconds <= 0:
            return
        if r.samples is not None:
            record["samples_per_s"] = r.samples * self._processes / seconds
        if r.tokens is not None:
            record["tokens_per_s"] = float(r.tokens) * self._processes / seconds

    def _line_at_or_before(self, iteration: int) -> int:
        """The iteration of the last line at or before ``iteration`` (a resumed run's first line averages from there)."""
        last = iteration - iteration % self.interval
        if self._by_epoch and not self.ignore_last and self._epoch_len:
            last = max(last, iteration - iteration % self._epoch_len)
        return last

    # -- evaluation -------------------------------------------------------------------------
    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        if metrics is not None:  # None: a stop request cut the pass, there is nothing to log
            self._log_eval(trainer, "val", metrics)

    def after_test_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        if metrics is not None:
            self._log_eval(trainer, "test", metrics)

    def _log_eval(self, trainer: TrainerView, mode: str, metrics: dict[str, float]) -> None:
        self.write_pending(trainer)  # pending training lines first, in order
        p = trainer.progress
        record = {"mode": mode, "epoch": p.epoch, "iter": p.iteration, **{k: float(v) for k, v in metrics.items()}}
        for w in trainer.writers:
            w.write_eval(record)
