"""Per-hook timing: trainer.hooks.report() and the table logged when training ends."""

from __future__ import annotations

import time

import pytest
from conftest import regression_set

import trainwright as tw
from trainwright.hooks import LoggerHook


class Sleeper(tw.Hook):
    """Sleeps a known time in two events."""

    def __init__(self, epoch_s: float, iter_s: float) -> None:
        self.epoch_s, self.iter_s = epoch_s, iter_s

    def after_train_epoch(self, trainer):
        time.sleep(self.epoch_s)

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        time.sleep(self.iter_s)


class EveryFour(tw.Hook):
    def train_iter_interval(self, trainer):
        return 4

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        pass


def _rows(trainer):
    return {(r.hook, r.event): r for r in trainer.hooks.report()}


def test_report_times_a_sleeping_hook_and_counts_calls(trainer_factory):
    t = trainer_factory(
        custom_hooks=[Sleeper(0.03, 0.002), EveryFour()], train_cfg=dict(max_epochs=2)
    )  # 10 iterations per epoch
    t0 = time.perf_counter()
    t.train()
    wall = time.perf_counter() - t0
    rows = _rows(t)
    epoch, it = rows[("Sleeper", "after_train_epoch")], rows[("Sleeper", "after_train_iter")]
    assert epoch.calls == 2 and 0.06 <= epoch.total_s < wall
    assert it.calls == 20 and 0.04 <= it.total_s < wall
    assert epoch.mean_ms == pytest.approx(epoch.total_s / 2 * 1e3)
    assert epoch.mean_ms >= 30
    assert rows[("EveryFour", "after_train_iter")].calls == 6  # 4, 8, 10 (epoch end), 12, 16, 20
    assert rows[("LoggerHook", "after_train_iter")].calls == 2  # interval 10


def test_every_active_hook_is_listed_with_its_events(trainer_factory):
    t = trainer_factory(default_hooks=dict(), custom_hooks=[Sleeper(0.0, 0.0)])
    t.train()
    report = t.hooks.report()
    # every hook with an event in this run (the RuntimeInfoHook has evaluation events only, and there is no validation)
    assert {r.hook for r in report} == {type(h).__name__ for h in t.hooks} - {"RuntimeInfoHook"}
    assert all(r.calls > 0 and r.total_s >= 0 for r in report)
    assert ("LoggerHook", "after_train_iter") in _rows(t) and ("CheckpointHook", "after_train_epoch") in _rows(t)
    table = str(report)
    assert table.splitlines()[0].split() == ["hook", "event", "calls", "total", "s", "mean", "ms"]
    assert len(table.splitlines()) == len(report) + 1


def test_table_is_logged_when_training_ends(trainer_factory):
    t = trainer_factory(
        custom_hooks=[Sleeper(0.01, 0.0)], log_level="INFO", hook_timing=True
    )  # by default: at DEBUG only
    t.train()
    t.flush_logs()
    log = (t.run_dir / "train.log").read_text()
    assert "Time spent in hooks" in log
    line = next(x for x in log.splitlines() if x.startswith("Sleeper") and "after_train_epoch" in x)
    assert line.split()[2] == "1"


def test_validation_events_are_timed_too(trainer_factory):
    t = trainer_factory(val_dataloader=dict(dataset=regression_set(), batch_size=5))
    with pytest.warns(UserWarning, match="without a val_evaluator"):
        t.train()
    assert _rows(t)[("ProgressBarHook", "after_val_iter")].calls == 4  # 20 samples / 5


def test_two_copies_of_a_hook_are_told_apart(trainer_factory):
    a, b = EveryFour(), EveryFour()
    t = trainer_factory(custom_hooks=[a, b])
    t.train()
    names = [r.hook for r in t.hooks.report() if r.event == "after_train_iter" and r.hook.startswith("EveryFour")]
    assert len(names) == 2 and len(set(names)) == 2


def test_timing_off_keeps_plain_methods_and_report_says_how_to_turn_it_on(trainer_factory):
    t = trainer_factory(hook_timing=False, log_level="INFO")
    t.train()
    logger_hook = t.hooks.get(LoggerHook)
    assert logger_hook.after_train_iter in t.hooks.calls["after_train_iter"]
    with pytest.raises(RuntimeError, match="hook_timing=True"):
        t.hooks.report()
    t.flush_logs()
    assert "Time spent in hooks" not in (t.run_dir / "train.log").read_text()


def test_a_failing_hook_is_still_named_in_the_cleanup_error(trainer_factory, caplog):
    class BadCleanup(tw.Hook):
        def after_run(self, trainer):
            raise OSError("disk gone")

    t = trainer_factory(custom_hooks=[BadCleanup()])
    with pytest.raises(OSError, match="disk gone"):
        t.train()
    assert _rows(t)[("BadCleanup", "after_run")].calls == 1
