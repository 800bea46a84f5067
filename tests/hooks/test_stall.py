"""StallHook: a process that finishes no iteration for timeout_s logs every thread's stack, once per stall (2
processes: test_stall_ranks)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.hooks import StallHook


class _StuckAt(tw.Hook):
    """Waits ``seconds`` after training iteration ``at`` (a hang that ends), or in validation iteration ``val_at``."""

    def __init__(self, at: int = 0, val_at: int = -1, seconds: float = 1.2) -> None:
        self.at, self.val_at, self.seconds = at, val_at, seconds

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        if trainer.progress.iteration == self.at:
            waiting_in_a_user_hook(self.seconds)

    def after_val_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        if batch_idx == self.val_at:
            waiting_in_a_user_hook(self.seconds)


def waiting_in_a_user_hook(seconds: float) -> None:
    time.sleep(seconds)


def _trainer(tmp_path: Path, stall: StallHook, stuck: _StuckAt, **kw) -> tw.Trainer:
    data = regression_set(32)
    return tw.Trainer(
        LinearReg(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(data, batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=6),
        default_hooks=dict(checkpoint=None, stall=stall),
        custom_hooks=[stuck],
        log_level="INFO",
        **kw,
    )


def test_a_stall_logs_each_threads_stack_once_and_the_run_goes_on(tmp_path: Path) -> None:
    stall = StallHook(timeout_s=0.4)
    t = _trainer(tmp_path, stall, _StuckAt(at=3, seconds=1.5))
    t.train()
    log = (t.run_dir / "train.log").read_text()
    t.close()
    # one report for the stall after iteration 3, however long (a slow start on a loaded machine may add one before
    # iteration 1)
    assert t.progress.iteration == 6 and log.count("(the run stands at iteration 3)") == 1, log
    assert stall.reports == log.count("No iteration finished on rank 0")
    report = log[log.index("No iteration finished on rank 0 for") :]
    report = report[report.index("(the run stands at iteration 3)") :]
    assert (
        "Thread 'MainThread':" in report and "in waiting_in_a_user_hook" in report and "time.sleep(seconds)" in report
    )
    assert "trainwright-stall-watch" not in report  # the watcher leaves its own stack out
    assert "default_hooks=dict(stall=dict(timeout_s=...))" in report
    assert not any(th.name == "trainwright-stall-watch" for th in threading.enumerate())  # stopped with the run


def test_validation_iterations_count_as_progress_and_a_stalled_one_is_reported(tmp_path: Path) -> None:
    stall = StallHook(timeout_s=2.0)
    val = DataLoader(regression_set(80), batch_size=2)

    class _SlowValBatch(tw.Hook):  # 40 validation iterations of 0.1 s each: 4 s of validation, never 2 s without one
        def after_val_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
            time.sleep(0.1)

    from trainwright.evaluation.metric import Metric

    class _Count(Metric):
        def process(self, data_batch, outputs):
            self.results.append(1)

        def compute(self, results):
            return {"n": float(len(results))}

    t = _trainer(tmp_path, stall, _SlowValBatch(), val_dataloader=val, val_evaluator=_Count())
    t.val()
    assert stall.reports == 0
    t.close()
    stall = StallHook(timeout_s=0.4)
    t = _trainer(tmp_path / "stuck", stall, _StuckAt(val_at=2, seconds=1.5), val_dataloader=val, val_evaluator=_Count())
    t.val()
    log = (t.run_dir / "train.log").read_text()
    t.close()
    assert stall.reports >= 1 and "in waiting_in_a_user_hook" in log


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        StallHook(timeout_s=0)
