"""LoggerHook: a log line and a ``metrics.jsonl`` record every ``interval`` iterations.

Pseudocode (what makes a log line cost ~nothing on the training hot path)::

    after_train_iter:  if it % interval == 0: requests.append((it, epoch, lr, ...))   # no numbers yet
                       if 1 s passed since the last write: metric_store.flush()
    metric_store.flush → listener(columns, urgent)   # every iteration's loss / time, as numbers
                       → (urgent, or 1 s since the last write) one record per request: mean
                         loss of its interval, lr, time, ETA → metrics.jsonl lines and
                         console / train.log lines, in one batch

Turning numbers into text is the costly part of logging (it runs on cold caches between
training steps), so lines are rendered together, at most once per ``flush_secs`` while
training runs fast, and right away when the previous batch is older than that (slow steps).
Anything that needs the lines - validation results, a checkpoint, the end of an epoch or of
the run, an error - flushes the store first, so lines keep their order and are on disk.
"""

from __future__ import annotations

import bisect
import datetime
import functools
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from trainwright.hooks.hook import Hook
from trainwright.logging.logger import log_lines
from trainwright.logging.metric_store import Columns
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer

_TIME_KEYS = ("time", "data_time")
_META = ("mode", "epoch", "iter")


def _template(keys: tuple[str, ...]) -> str:
    """``"  loss: {:.4f}  lr: {:.4e}  eta: {}  ..."`` for records with these keys (the first three are meta)."""
    parts = []
    for k in keys[len(_META) :]:
        lr = k == "lr" or k.endswith(".lr")
        parts.append(f"  {k}: {{:.4e}}" if lr else f"  {k}: {{:.4f}}")
        if k == "lr" and "time" in keys:
            parts.append("  eta: {}")
    return "".join(parts)


class _Request(NamedTuple):
    """What a training log line needs that is only known at its iteration."""

    iteration: int
    epoch: int
    batch_idx: int
    lr: dict[str, list[float]]  # OptimWrapper.get_lr() at that iteration
    created: float  # wall-clock time of the iteration (the line's timestamp)
    grad_norm: Any  # a tensor (converted when the line is written) or None
    loss_scale: float | None


_new_request = functools.partial(tuple.__new__, _Request)  # no Python-level __new__ on the hot path


@HOOKS.register
class LoggerHook(Hook):
    """Logs training scalars at an interval and validation / test metrics after each pass.

    Each training line shows the mean of every loss over the last ``interval`` iterations,
    the latest value of other logged outputs, the learning rate, the mean iteration and
    data time, and the ETA; the same numbers go to ``metrics.jsonl``.

    Args:
        interval: Iterations between log lines.
        ignore_last: Skip the log line for an epoch's last, shorter interval.
        flush_secs: While training runs faster than one line per ``flush_secs``, lines are
            written in batches at most this far apart (0 writes each line at once).
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
        self._cols: dict[str, tuple[list[int], list[float]]] = {}
        self._last_write = 0.0
        self._by_epoch = True
        self._epoch_len = 0
        self._max_iters = 0
        self._width = 1
        self._log_scale = False
        self._templates: dict[tuple[str, ...], str] = {}
        self._sink: tuple[Any, Any] | None = None  # (metrics writer, logger) on the main process

    # -- training ---------------------------------------------------------------------------
    def before_train(self, trainer: Trainer) -> None:  # noqa: D102
        loop = trainer.train_loop
        self._by_epoch = loop.by_epoch
        self._epoch_len = len(loop.dataloader)
        self._max_iters = loop.max_iters
        self._width = len(str(self._epoch_len if loop.by_epoch else self._max_iters))
        # Only a float16 GradScaler has a loss scale to log (it may not exist before the first step).
        self._log_scale = getattr(getattr(trainer.optim_wrapper, "precision", None), "scaler", None) is not None
        self._last_idx = self._epoch_len - 1 if loop.by_epoch and not self.ignore_last else -1
        self._requests = []  # self._cols stays: a resumed run restored the last interval's numbers into it
        self._sink = (trainer.writer, trainer.logger) if trainer.is_main_process else None
        trainer.metric_store.add_listener(self._on_flush)
        self._last_write = time.perf_counter()

    def train_iter_interval(self, trainer: Trainer) -> int:  # noqa: D102
        return self.interval  # the loop calls after_train_iter at multiples of it and at epoch ends only

    def after_train_iter(self, trainer: Trainer, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        if trainer.progress.iteration % self.interval == 0 or batch_idx == self._last_idx:
            # Runs once per interval, so its code is cold each time: keep it to reading values.
            p = trainer.progress
            ow = trainer.optim_wrapper
            scale = ow.loss_scale if self._log_scale else None
            if scale is not None:
                scale = float(scale)
            self._requests.append(_new_request((p.iteration, p.epoch + 1 if self._by_epoch else p.epoch, batch_idx, ow.get_lr(), time.time(), getattr(ow, "grad_norm", None), scale)))
            if time.perf_counter() - self._last_write >= self.flush_secs:
                trainer.metric_store.flush()  # → _on_flush writes the lines

    def after_train(self, trainer: Trainer) -> None:  # noqa: D102
        trainer.metric_store.flush()  # the loop flushed at the end; a no-op unless a hook logged since
        trainer.metric_store.remove_listener(self._on_flush)

    def after_run(self, trainer: Trainer) -> None:  # noqa: D102
        # The run may have ended with an error: drop the listener, keep what was logged.
        trainer.metric_store.remove_listener(self._on_flush)

    # -- state: the numbers the next line's window still needs (a resumed run logs the same means) --
    def state_dict(self) -> dict[str, Any]:
        """Per name, the iterations and values of the last ``interval`` iterations seen."""
        last = max((iters[-1] for iters, _ in self._cols.values() if iters), default=0)
        out = {}
        for name, (iters, values) in self._cols.items():
            k = bisect.bisect_right(iters, last - self.interval)
            out[name] = [iters[k:], values[k:]]
        return {"columns": out}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (what the first lines after a resume average over)."""
        self._cols = {name: (list(iters), list(values)) for name, (iters, values) in state.get("columns", {}).items()}

    def _on_flush(self, columns: Columns, urgent: bool = True) -> None:
        """Store listener: collect the new numbers, then write every requested line they complete.

        The store's automatic flush (every 1,000 iterations) only converts numbers; lines wait
        for the next due line ``flush_secs`` after the last write, or for an urgent flush.
        """
        cols = self._cols
        for name, (iters, values) in columns.items():
            if name.startswith("val"):
                continue
            if iters and iters[0] < 0:  # numbers recorded without an iteration belong to no line
                kept = [(i, v) for i, v in zip(iters, values) if i >= 0]
                iters, values = [i for i, _ in kept], [v for _, v in kept]
            col = cols.get(name)
            if col is None:
                cols[name] = (list(iters), list(values))
            else:
                col[0].extend(iters)
                col[1].extend(values)
        if not self._requests or (not urgent and time.perf_counter() - self._last_write < self.flush_secs):
            return
        requests, self._requests = self._requests, []
        records = self._records(requests)
        if self._sink is not None:
            writer, logger = self._sink
            writer.write_many(records)
            log_lines(logger, [self._format(r, rec) for r, rec in zip(requests, records)], created=[r.created for r in requests])
        # Keep only what a later line's window (its last `interval` iterations) can still need.
        keep_after = requests[-1].iteration - self.interval
        for iters, values in cols.values():
            k = bisect.bisect_right(iters, keep_after)
            if k:
                del iters[:k], values[:k]
        self._last_write = time.perf_counter()

    def _records(self, requests: list[_Request]) -> list[dict[str, Any]]:
        """metrics.jsonl records: per line, loss means over its interval, the latest other values."""
        out = []
        cols = [(name, iters, values, "loss" in name or name in _TIME_KEYS) for name, (iters, values) in self._cols.items()]
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
            for k, v in r.lr.items():
                record[k] = v[0]
            if r.grad_norm is not None:
                record["grad_norm"] = float(r.grad_norm)
            if r.loss_scale is not None:
                record["loss_scale"] = r.loss_scale
            if "time" in times:
                record["time"] = times["time"]
                record["data_time"] = times.get("data_time", 0.0)
            out.append(record)
        return out

    def _format(self, r: _Request, rec: dict[str, Any]) -> str:
        if self._by_epoch:
            head = f"Epoch(train) [{r.epoch}][{str(r.batch_idx + 1).rjust(self._width)}/{self._epoch_len}]"
        else:
            head = f"Iter(train) [{str(r.iteration).rjust(self._width)}/{self._max_iters}]"
        keys = tuple(rec)
        template = self._templates.get(keys)
        if template is None:
            template = self._templates[keys] = _template(keys)
        values = [v for k, v in rec.items() if k not in _META]
        if "lr" in rec and "time" in rec:  # the ETA follows the lr
            values.insert(keys.index("lr") - len(_META) + 1, datetime.timedelta(seconds=int(rec["time"] * (self._max_iters - r.iteration))))
        return head + template.format(*values)

    # -- evaluation -------------------------------------------------------------------------
    def after_val_epoch(self, trainer: Trainer, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        self._log_eval(trainer, "val", metrics or {})

    def after_test_epoch(self, trainer: Trainer, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        self._log_eval(trainer, "test", metrics or {})

    def _log_eval(self, trainer: Trainer, mode: str, metrics: dict[str, float]) -> None:
        trainer.metric_store.flush()  # pending training lines first, in order
        if not trainer.is_main_process:
            return
        p = trainer.progress
        record = {"mode": mode, "epoch": p.epoch, "iter": p.iteration, **{k: float(v) for k, v in metrics.items()}}
        trainer.writer.write(record)
        shown = "  ".join(f"{k}: {v:.4f}" for k, v in metrics.items())
        trainer.logger.info(f"Epoch({mode}) [{p.epoch}] iter {p.iteration}  {shown}")
