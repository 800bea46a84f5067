"""LoggerHook: a log line and a ``metrics.jsonl`` record every ``interval`` iterations."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.logging.logger import log_fast
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer

_TIME_KEYS = ("time", "data_time")


@HOOKS.register
class LoggerHook(Hook):
    """Logs training scalars at an interval and validation / test metrics after each pass.

    This is the one place where the hot loop's tensors become numbers: every ``interval``
    iterations the metric store is flushed (one device→host transfer), which is also when
    a NaN/Inf loss is detected.

    Args:
        interval: Iterations between log lines.
        ignore_last: Skip the log line for an epoch's last, shorter interval.
    """

    priority = "BELOW_NORMAL"

    def __init__(self, interval: int = 10, ignore_last: bool = False) -> None:
        if interval < 1:
            raise ValueError(f"LoggerHook interval must be >= 1, got {interval}")
        self.interval = interval
        self.ignore_last = ignore_last
        self._last_idx = -1

    def before_train(self, trainer: Trainer) -> None:  # noqa: D102
        loop = trainer.train_loop
        self._last_idx = len(loop.dataloader) - 1 if loop.by_epoch and not self.ignore_last else -1

    def after_train_iter(self, trainer: Trainer, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        if trainer.progress.iteration % self.interval == 0 or batch_idx == self._last_idx:
            self._log_train(trainer, batch_idx)

    def _log_train(self, trainer: Trainer, batch_idx: int) -> None:
        store = trainer.metric_store
        store.flush()
        p = trainer.progress
        loop = trainer.train_loop
        record: dict[str, Any] = {"mode": "train", "epoch": p.epoch + 1 if loop.by_epoch else p.epoch, "iter": p.iteration}
        n = self.interval
        for name in store.names():
            buf = store.get(name)
            if buf.latest_iter > p.iteration - n and name not in _TIME_KEYS and not name.startswith("val"):
                record[name] = buf.mean(min(n, buf.count)) if "loss" in name else buf.latest
        ow = trainer.optim_wrapper
        for k, v in ow.get_lr().items():
            record[k] = v[0]
        gn = getattr(ow, "grad_norm", None)
        if gn is not None:
            record["grad_norm"] = float(gn)
        scale = getattr(ow, "loss_scale", None)
        if scale is not None:
            record["loss_scale"] = float(scale)
        eta = None
        if "time" in store:
            t = store.get("time")
            record["time"] = t.mean(min(n, t.count))
            record["data_time"] = store.get("data_time").mean(min(n, t.count)) if "data_time" in store else 0.0
            eta = record["time"] * (loop.max_iters - p.iteration)
        if trainer.is_main_process:
            trainer.writer.write(record)
            log_fast(trainer.logger, self._format(trainer, record, batch_idx, eta))

    def _format(self, trainer: Trainer, r: dict[str, Any], batch_idx: int, eta: float | None) -> str:
        loop = trainer.train_loop
        if loop.by_epoch:
            total = len(loop.dataloader)
            head = f"Epoch(train) [{r['epoch']}][{batch_idx + 1:>{len(str(total))}}/{total}]"
        else:
            head = f"Iter(train) [{r['iter']:>{len(str(loop.max_iters))}}/{loop.max_iters}]"
        parts = [head]
        for k, v in r.items():
            if k in ("mode", "epoch", "iter"):
                continue
            if k == "lr" or k.endswith(".lr"):
                parts.append(f"{k}: {v:.4e}")
            elif isinstance(v, float):
                parts.append(f"{k}: {v:.4f}")
            if k == "lr" and eta is not None:
                parts.append(f"eta: {datetime.timedelta(seconds=int(eta))}")
        return "  ".join(parts)

    def after_val_epoch(self, trainer: Trainer, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        self._log_eval(trainer, "val", metrics or {})

    def after_test_epoch(self, trainer: Trainer, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        self._log_eval(trainer, "test", metrics or {})

    def _log_eval(self, trainer: Trainer, mode: str, metrics: dict[str, float]) -> None:
        if not trainer.is_main_process:
            return
        p = trainer.progress
        record = {"mode": mode, "epoch": p.epoch, "iter": p.iteration, **{k: float(v) for k, v in metrics.items()}}
        trainer.writer.write(record)
        shown = "  ".join(f"{k}: {v:.4f}" for k, v in metrics.items())
        trainer.logger.info(f"Epoch({mode}) [{p.epoch}] iter {p.iteration}  {shown}")
