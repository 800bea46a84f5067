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
shared by all processes (under several processes in the one collective of the logging
iteration, which also reduces the logged numbers over the processes: rank 0's lines show
the mean loss of all ranks and the slowest rank's ``data_time``). Pending lines are also written at the end of each epoch, of
training and of the run (also after an error) and before evaluation results, in order.

The hook owns no numbers: the metric store keeps them (and is checkpointed), so a resumed
run's first lines average over the same values as the uninterrupted run's.
"""

from __future__ import annotations

import bisect
import functools
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
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


_new_request = functools.partial(tuple.__new__, _Request)  # no Python-level __new__ on the hot path


@HOOKS.register
class LoggerHook(Hook):
    """Logs training scalars at an interval and validation / test metrics after each pass.

    Each training record holds the mean of every loss and of the times over the last
    ``interval`` iterations, the latest value of other logged outputs, the learning rate,
    the grad norm and the loss scale; the writers of ``trainer.writers`` show it (the console
    adds the ETA) or store it (``metrics.jsonl``).

    Args:
        interval: Iterations between log lines.
        ignore_last: Skip the log line for an epoch's last, shorter interval.
        flush_secs: While training runs faster than one line per ``flush_secs``, lines are
            written in batches at most this far apart (0 writes each line at once). With
            several processes lines are written when any of them proposes it, and at the
            latest every ``metric_store.flush_every`` iterations; each logging iteration
            makes one small collective (the store's flush: the proposal, a stop request, the
            NaN check and the numbers, reduced over the processes - ``data_time`` the max,
            the rest the mean), and no other iteration makes any.
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
        # Lines are written at least every flush_every iterations (see after_train_iter), so the
        # values of the oldest pending line's interval are still in the store's buffers then.
        trainer.metric_store.keep_history(trainer.metric_store.flush_every + 2 * self.interval)
        self._last_write = time.perf_counter()
        trainer.hold_log_lines(lambda: self._write_lines(trainer))  # trainer.flush_logs() writes what is held

    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        return self.interval  # the loop calls after_train_iter at multiples of it and at epoch ends only

    def after_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        if trainer.progress.iteration % self.interval == 0 or batch_idx == self._last_idx:
            # Runs once per interval, so its code is cold each time: keep it to reading values.
            p = trainer.progress
            ow = trainer.optim_wrapper
            scale = ow.loss_scale if self._log_scale else None
            if scale is not None:
                scale = float(scale)
            self._requests.append(_new_request((p.iteration, p.epoch + 1 if self._by_epoch else p.epoch, batch_idx, ow.get_lr(), time.time(), getattr(ow, "grad_norm", None), scale)))
            store = trainer.metric_store
            due = time.perf_counter() - self._last_write >= self.flush_secs or p.iteration - self._written_to >= store.flush_every
            if store.flush_if(due):
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
            iters, values = store.get(name).history()
            if iters and min(iters) < 0:  # numbers recorded without an iteration belong to no line
                values = [v for i, v in zip(iters, values) if i >= 0]
                iters = [i for i in iters if i >= 0]
            cols.append((name, iters, values, "loss" in name or name in _TIME_KEYS))
        out = []
        for r in requests:
            hi = r.iteration
            lo = hi - self.interval
            record: dict[str, Any] = {"mode": "train", "epoch": r.epoch, "iter": hi}
            times: dict[str, float] = {}
            for name, iters, values, mean in cols:
                a, b = bisect.bisect_right(iters, lo), bisect.bisect_right(iters, hi)
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
            out.append(record)
        return out

    # -- evaluation -------------------------------------------------------------------------
    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        self._log_eval(trainer, "val", metrics or {})

    def after_test_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        self._log_eval(trainer, "test", metrics or {})

    def _log_eval(self, trainer: TrainerView, mode: str, metrics: dict[str, float]) -> None:
        self.write_pending(trainer)  # pending training lines first, in order
        p = trainer.progress
        record = {"mode": mode, "epoch": p.epoch, "iter": p.iteration, **{k: float(v) for k, v in metrics.items()}}
        for w in trainer.writers:
            w.write_eval(record)
