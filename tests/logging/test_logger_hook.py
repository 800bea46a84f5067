"""LoggerHook and IterTimerHook as a user sees them: the numbers in metrics.jsonl and when lines appear."""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import LinearReg, RecordLosses, regression_set, train_records
from torch.utils.data import DataLoader, Dataset

import trainwright as tw


@pytest.mark.parametrize("flush_secs", [0.0, 1.0, 3600.0])
def test_each_line_holds_the_mean_loss_of_its_interval(trainer_factory: Any, flush_secs: float) -> None:
    ref = RecordLosses()
    t = trainer_factory(
        dataset=regression_set(40),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        log_level="INFO",  # 10 iterations per epoch
        default_hooks=dict(checkpoint=None, logger=dict(interval=3, flush_secs=flush_secs)),
        custom_hooks=[ref],
    )
    t.train()
    recs = train_records(t.run_dir)
    # Every 3 iterations counted within the epoch (mmengine's), plus each epoch's last (shorter)
    # interval; each line averages the iterations since the previous line (10 holds only
    # iteration 10, 13 holds 11-13).
    assert [r["iter"] for r in recs] == [3, 6, 9, 10, 13, 16, 19, 20]
    prev = 0
    for r in recs:
        window = [ref.losses[i] for i in range(prev + 1, r["iter"] + 1)]
        assert r["loss"] == pytest.approx(sum(window) / len(window), rel=1e-12, abs=0)
        prev = r["iter"]
        assert r["epoch"] == (1 if r["iter"] <= 10 else 2)
        assert r["lr"] == pytest.approx(0.05)
        assert r["time"] > 0 and r["data_time"] >= 0
    lines = [ln for ln in (t.run_dir / "train.log").read_text().splitlines() if "Epoch(train)" in ln]
    assert len(lines) == len(recs)
    assert "Epoch(train) [1][ 3/10]" in lines[0] and "Epoch(train) [2][10/10]" in lines[-1]


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.msgs: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.msgs.append(record.getMessage())


class CountLinesSoFar(tw.Hook):
    priority = "LOWEST"

    def __init__(self, handler: Collect) -> None:
        self.handler = handler
        self.seen: dict[int, int] = {}

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        self.seen[trainer.progress.iteration] = sum("Epoch(train)" in m for m in self.handler.msgs)


def test_flush_secs_zero_writes_each_line_at_its_iteration_and_default_batches(trainer_factory: Any) -> None:
    for flush_secs, expect_immediate in ((0.0, True), (3600.0, False)):
        handler = Collect()
        probe = CountLinesSoFar(handler)
        t = trainer_factory(
            dataset=regression_set(40),
            batch_size=4,
            train_cfg=dict(by_epoch=True, max_epochs=1),
            log_level="INFO",
            default_hooks=dict(checkpoint=None, logger=dict(interval=2, flush_secs=flush_secs)),
            custom_hooks=[probe],
        )
        t.logger.addHandler(handler)  # a user's own handler gets ordinary records
        t.train()
        if expect_immediate:
            assert probe.seen == {i: i // 2 for i in range(1, 11)}
        else:  # held until the end of the epoch, then all of them, in order
            assert set(probe.seen.values()) == {0}
        lines = [m for m in handler.msgs if "Epoch(train)" in m]
        assert [m.split("]")[1] for m in lines] == [f"[{i:>2}/10" for i in range(2, 11, 2)]


def test_lines_logged_before_an_error_reach_the_files_and_the_error_is_not_masked(trainer_factory: Any) -> None:
    class Boom(tw.Hook):
        def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
            if trainer.progress.iteration == 7:
                raise RuntimeError("boom at 7")

    t = trainer_factory(
        dataset=regression_set(40),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=1),
        log_level="INFO",
        default_hooks=dict(checkpoint=None, logger=dict(interval=2, flush_secs=3600)),
        custom_hooks=[Boom()],
    )
    with pytest.raises(RuntimeError, match="boom at 7"):
        t.train()
    assert [r["iter"] for r in train_records(t.run_dir)] == [2, 4, 6]
    assert sum("Epoch(train)" in ln for ln in (t.run_dir / "train.log").read_text().splitlines()) == 3


def test_nan_loss_is_reported_at_its_iteration_within_the_flush_window(trainer_factory: Any) -> None:
    class NaNAt(LinearReg):
        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
            out = super().forward(x, y, mode)
            if mode == "loss" and self.training:
                self.calls = getattr(self, "calls", 0) + 1
                if self.calls == 6:
                    out = {"loss": out["loss"] * float("nan")}
            return out

    t = trainer_factory(
        model=NaNAt(),
        dataset=regression_set(40),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=1),
        log_level="INFO",
        default_hooks=dict(checkpoint=None, logger=dict(interval=2)),
    )
    with pytest.raises(FloatingPointError, match="iteration 6"):
        t.train()
    assert [r["iter"] for r in train_records(t.run_dir)][:2] == [2, 4]  # the lines before it were written


class Slow(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.02)
        return torch.ones(4), torch.ones(1)


class SlowStep(LinearReg):
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        time.sleep(0.01)
        return super().forward(x, y, mode)


def test_timer_separates_waiting_for_data_from_the_step(trainer_factory: Any) -> None:
    t = trainer_factory(
        model=SlowStep(),
        train_dataloader=DataLoader(Slow(), batch_size=1),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        log_level="INFO",
        default_hooks=dict(checkpoint=None, logger=dict(interval=1)),
    )
    t.train()
    for r in train_records(t.run_dir):
        assert 0.018 <= r["data_time"] < 0.2, r
        assert r["time"] - r["data_time"] >= 0.009, r


def test_resumed_run_logs_the_same_means_as_the_uninterrupted_run(trainer_factory: Any, tmp_path: Path) -> None:
    """The first line after a resume averages over iterations from before the checkpoint: the store's history has
    them."""

    class CrashAt9(tw.Hook):
        def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
            if trainer.progress.iteration == 9:
                raise RuntimeError("crash")

    kw: dict[str, Any] = dict(
        dataset=regression_set(20), batch_size=2, train_cfg=dict(by_epoch=True, max_epochs=2), log_level="INFO"
    )
    hooks = dict(checkpoint=dict(interval=6, by_epoch=False), logger=dict(interval=4))
    ref = trainer_factory(work_dir=tmp_path / "ref", default_hooks=hooks, **kw)
    ref.train()
    crashed = trainer_factory(work_dir=tmp_path / "work", default_hooks=hooks, custom_hooks=[CrashAt9()], **kw)
    with pytest.raises(RuntimeError, match="crash"):
        crashed.train()
    resumed = trainer_factory(work_dir=tmp_path / "work", default_hooks=hooks, resume=True, **kw)
    resumed.train()
    assert resumed.metric_store.get("loss").count > 0
    same = {"time", "data_time", "samples_per_s", "tflops"}  # wall-clock numbers differ between runs
    after = [{k: v for k, v in r.items() if k not in same} for r in train_records(resumed.run_dir)]
    expected = [{k: v for k, v in r.items() if k not in same} for r in train_records(ref.run_dir) if r["iter"] > 6]
    assert [r["iter"] for r in after] == [8, 10, 14, 18, 20]  # resumed from iter_6: the line at 8 averages 5..8
    assert after == expected


def test_lines_held_by_the_clock_are_written_every_flush_every_iterations_with_exact_means(
    trainer_factory: Any,
) -> None:
    """With the clock never due, lines still go out every ``flush_every`` iterations, while the store still holds
    their values."""
    ref = RecordLosses()
    handler = Collect()
    probe = CountLinesSoFar(handler)
    t = trainer_factory(
        dataset=regression_set(80),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        log_level="INFO",  # 20 iterations per epoch
        default_hooks=dict(checkpoint=None, logger=dict(interval=3, flush_secs=3600.0)),
        custom_hooks=[ref, probe],
    )
    t.metric_store.flush_every = 7
    t.metric_store.window_size = 1  # buffers keep only what the logger asks for
    t.logger.addHandler(handler)
    t.train()
    recs = train_records(t.run_dir)
    assert [r["iter"] for r in recs] == [*range(3, 21, 3), 20, *range(23, 41, 3), 40]  # counted within each epoch of 20
    prev = 0
    for r in recs:  # each line averages the iterations since the previous one
        window = [ref.losses[i] for i in range(prev + 1, r["iter"] + 1)]
        assert r["loss"] == pytest.approx(sum(window) / len(window), rel=1e-12, abs=0)
        prev = r["iter"]
    written = [probe.seen[i] for i in range(1, 41)]
    assert 0 < written[9] < written[19]  # not held until the epoch's end


def test_flush_logs_writes_the_lines_held_for_their_batch(trainer_factory: Any) -> None:
    """What a checkpoint relies on: after flush_logs every line logged so far is in the files (a resumed run will not
    log it again)."""

    class FlushAt5(tw.Hook):
        priority = "LOWEST"

        def __init__(self) -> None:
            self.seen: list[int] = []

        def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
            if trainer.progress.iteration == 5:
                trainer.flush_logs()
                self.seen = [r["iter"] for r in train_records(trainer.run_dir)]

    probe = FlushAt5()
    t = trainer_factory(
        dataset=regression_set(40),
        batch_size=4,
        log_level="INFO",
        default_hooks=dict(checkpoint=None, logger=dict(interval=2, flush_secs=3600)),
        custom_hooks=[probe],
    )
    t.train()
    assert probe.seen == [2, 4]
    assert sum("Epoch(train)" in ln for ln in (t.run_dir / "train.log").read_text().splitlines()) == 5


def test_a_line_whose_values_left_the_store_s_history_warns(trainer_factory: Any) -> None:
    """Lines held longer than the history the logger asked for (flush_every raised after it sized it): a warning
    names the line, the key and the fix, once."""

    class RaiseFlushEvery(tw.Hook):
        priority = "LOWEST"  # after the logger sized the store's history for flush_every=5

        def before_train(self, trainer: Any) -> None:
            trainer.metric_store.flush_every = 1000  # lines are now held until the epoch's end

    t = trainer_factory(
        dataset=regression_set(160),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=1),  # 40 iterations
        default_hooks=dict(checkpoint=None, logger=dict(interval=3, flush_secs=3600.0)),
        custom_hooks=[RaiseFlushEvery()],
    )
    t.metric_store.flush_every = 5
    with pytest.warns(
        RuntimeWarning, match=r"line of iteration 3 should average 'loss' over iterations 1\.\.3.*window_size"
    ) as caught:
        t.train()
    assert sum("LoggerHook: the line" in str(w.message) for w in caught) == 1


def test_lines_within_the_store_s_history_do_not_warn(trainer_factory: Any) -> None:
    t = trainer_factory(
        dataset=regression_set(160),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=None, logger=dict(interval=3, flush_secs=3600.0)),
    )
    t.metric_store.flush_every = 5
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        t.train()
    assert len(train_records(t.run_dir)) == 14
