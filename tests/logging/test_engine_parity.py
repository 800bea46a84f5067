"""detectron2 engine parity: the iteration timer's warm-up (IterationTimer warmup_iter) and gather_metric_period
(SimpleTrainer)."""

from __future__ import annotations

import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import LinearReg, RecordLosses, regression_set, train_records

from trainwright.hooks.iter_timer import IterTimerHook
from trainwright.logging.metric_store import MetricStore

# -- the timer's warm-up --------------------------------------------------------------------


def test_store_gives_no_times_to_warm_up_iterations_and_measures_the_next_from_their_end() -> None:
    store = MetricStore()
    store.start_clock(0.0)
    store.skip_times_until(3)
    end = 0.0
    for it in range(1, 7):  # iteration k waits 0.5 s for data and takes k seconds in all
        start, end = end + 0.5, end + it
        store.record(it, {"loss": 1.0}, start, end)
    store.flush()
    assert store.get("time").history() == ([4, 5, 6], [4.0, 5.0, 6.0])
    assert store.get("data_time").history() == ([4, 5, 6], [0.5, 0.5, 0.5])


def test_warmup_iterations_are_left_out_of_the_logged_times_also_after_a_resume(
    trainer_factory: Any, tmp_path: Path
) -> None:
    kw: dict[str, Any] = dict(
        dataset=regression_set(20), batch_size=2, train_cfg=dict(by_epoch=True, max_epochs=2), log_level="INFO"
    )
    hooks = dict(
        timer=dict(warmup_iter=3), logger=dict(interval=1), checkpoint=dict(interval=6, by_epoch=False, save_last=False)
    )
    t = trainer_factory(
        work_dir=tmp_path / "a",
        default_hooks=hooks,
        train_cfg=dict(by_epoch=True, max_epochs=1),
        **{k: v for k, v in kw.items() if k != "train_cfg"},
    )
    t.train()
    recs = train_records(t.run_dir)
    # detectron2: an iteration is timed when iter_done >= warmup_iter (1-based), so warmup_iter=3 leaves out iterations
    # 1-2
    assert [r["iter"] for r in recs if "time" in r] == list(range(3, 11))
    assert all("data_time" not in r for r in recs[:2])
    resumed = trainer_factory(work_dir=tmp_path / "a", default_hooks=hooks, resume=True, experiment_name="b", **kw)
    resumed.train()  # from iter_6.pth, the only checkpoint of the first run
    recs = train_records(resumed.run_dir)
    assert recs[0]["iter"] == 7
    assert [r["iter"] for r in recs if "time" in r] == list(
        range(9, 21)
    )  # the warm-up counts from where this train() starts


def test_no_warmup_times_every_iteration(trainer_factory: Any) -> None:
    t = trainer_factory(
        dataset=regression_set(8),
        batch_size=2,
        log_level="INFO",
        default_hooks=dict(checkpoint=None, logger=dict(interval=1)),
    )
    t.train()
    assert [r["iter"] for r in train_records(t.run_dir) if "time" in r] == [1, 2, 3, 4]


def test_negative_warmup_is_refused() -> None:
    with pytest.raises(ValueError, match="warmup_iter must be an int >= 0"):
        IterTimerHook(warmup_iter=-1)


# -- gather_metric_period -------------------------------------------------------------------


def test_period_one_records_with_a_plain_list_append() -> None:
    store = MetricStore()
    record = store.recorder(1)
    assert isinstance(
        record, types.BuiltinMethodType
    )  # nothing wraps the hot path when the feature is off: no Python frame
    record((1, {"loss": torch.tensor(2.0)}, None, None))
    store.flush()  # a flush empties the list in place: the recorder keeps feeding the store
    record((2, {"loss": torch.tensor(4.0)}, None, None))
    store.flush()
    assert store.get("loss").history() == ([1, 2], [2.0, 4.0])
    with pytest.raises(ValueError, match="gather_metric_period"):
        store.recorder(0)


def test_outputs_are_recorded_every_n_iterations_with_their_own_values(trainer_factory: Any) -> None:
    ref = RecordLosses()
    t = trainer_factory(
        dataset=regression_set(24),
        batch_size=2,
        train_cfg=dict(by_epoch=True, max_epochs=1, gather_metric_period=3),
        log_level="INFO",
        default_hooks=dict(checkpoint=None, logger=dict(interval=6)),
        custom_hooks=[ref],
    )
    t.train()
    iters, values = t.metric_store.get("loss").history()
    assert iters == [3, 6, 9, 12]  # detectron2: metrics are written when (iter + 1) % gather_metric_period == 0
    assert values == [pytest.approx(ref.losses[i], rel=1e-6) for i in iters]
    assert t.metric_store.get("time").history()[0] == list(range(1, 13))  # detectron2's timer: every iteration
    recs = train_records(t.run_dir)
    assert [r["iter"] for r in recs] == [6, 12]
    for r in recs:  # each line averages the recorded iterations of its interval
        assert r["loss"] == pytest.approx((ref.losses[r["iter"] - 3] + ref.losses[r["iter"]]) / 2, rel=1e-6)


class SlowStep(LinearReg):
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        time.sleep(0.05)
        return super().forward(x, y, mode)


def test_every_iteration_is_timed_on_its_own_whatever_the_period(trainer_factory: Any) -> None:
    t = trainer_factory(
        model=SlowStep(),
        dataset=regression_set(12),
        batch_size=2,
        train_cfg=dict(by_epoch=True, max_epochs=1, gather_metric_period=3),
    )
    t.train()
    iters, times = t.metric_store.get("time").history()
    assert iters == [1, 2, 3, 4, 5, 6]  # as detectron2's IterationTimer, which writes `time` every iteration
    assert all(0.045 <= s < 0.12 for s in times), times  # each one 0.05 s step
    assert t.metric_store.get("loss").history()[0] == [3, 6]  # the outputs: every 3rd iteration only


def test_invalid_period_is_refused_when_the_loop_is_built(trainer_factory: Any) -> None:
    t = trainer_factory(train_cfg=dict(by_epoch=True, max_epochs=1, gather_metric_period=0))
    with pytest.raises(ValueError, match="gather_metric_period must be an int >= 1"):
        t.train()


def test_the_train_loop_flushes_the_store_at_every_flush_every_th_iteration(trainer_factory: Any) -> None:
    """The loop records with a plain append; the store's memory bound comes from the schedule: converted at
    iterations 5 and 10 only."""
    import trainwright as tw

    class Probe(tw.Hook):
        priority = "LOWEST"

        def __init__(self) -> None:
            self.converted: list[int] = []

        def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
            self.converted.append(trainer.metric_store.buffer("loss").count)

    probe = Probe()
    t = trainer_factory(
        dataset=regression_set(48),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=1),  # 12 iterations
        default_hooks=dict(checkpoint=None, logger=dict(interval=1000, flush_secs=3600.0)),
        custom_hooks=[probe],
    )
    t.metric_store.flush_every = 5
    t.train()
    # the periodic flush runs after the hooks of its iteration: a hook at 6 sees the 5 rows converted at 5;
    # at the epoch's last iteration the logger's line (more than flush_every iterations unwritten) flushes first
    assert probe.converted == [0] * 5 + [5] * 5 + [10] + [12]


def test_the_logger_interval_counts_within_the_epoch_as_mmengines(trainer_factory: Any) -> None:
    """mmengine's LoggerHook(interval=10) on 45 iterations per epoch logs epoch 2 at [2][10/45], [2][20/45]...
    (every_n_inner_iters)."""
    t = trainer_factory(
        dataset=regression_set(45),
        batch_size=1,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        log_level="INFO",
        default_hooks=dict(checkpoint=None, logger=dict(interval=10)),
    )
    t.train()
    assert [r["iter"] for r in train_records(t.run_dir)] == [10, 20, 30, 40, 45, 55, 65, 75, 85, 90]
    log = (t.run_dir / "train.log").read_text()
    assert "[2][10/45]" in log and "[2][5/45]" not in log
