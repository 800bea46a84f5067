"""default_hooks / custom_hooks configuration, checked on the files a run writes."""

from __future__ import annotations

import json

import pytest

import trainwright as tw
from trainwright.hooks import LoggerHook
from trainwright.registry import HOOKS


def _records(trainer: tw.Trainer, mode: str = "train") -> list[dict]:
    path = trainer.run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["mode"] == mode]


@HOOKS.register(name="TestEpochCounterHook")
class EpochCounter(tw.Hook):
    def __init__(self, start: int = 0) -> None:
        self.epochs = start

    def after_train_epoch(self, trainer):
        self.epochs += 1


def _expected_log_iters(interval: int, epoch_len: int, epochs: int) -> list[int]:
    """Every ``interval`` iterations counted within each epoch (mmengine's), plus each epoch's last iteration
    (ignore_last=False)."""
    total = epoch_len * epochs
    return [i for i in range(1, total + 1) if ((i - 1) % epoch_len + 1) % interval == 0 or i % epoch_len == 0]


@pytest.mark.parametrize("interval", [5, 3, 1])
def test_logger_interval_sets_record_count(trainer_factory, interval):
    t = trainer_factory(
        default_hooks=dict(checkpoint=None, logger=dict(interval=interval)), train_cfg=dict(max_epochs=2)
    )
    t.train()
    recs = _records(t)
    assert [r["iter"] for r in recs] == _expected_log_iters(interval, 10, 2)
    assert t.hooks.get(LoggerHook).interval == interval


def test_default_logger_interval_is_10(trainer_factory):
    t = trainer_factory(train_cfg=dict(by_epoch=False, max_iters=30))
    t.train()
    assert [r["iter"] for r in _records(t)] == [10, 20, 30]


def test_checkpoint_none_writes_no_checkpoint(trainer_factory):
    t = trainer_factory(default_hooks=dict(checkpoint=None), train_cfg=dict(max_epochs=2))
    t.train()
    assert not t.checkpoints.ckpt_dir.exists() or not any(t.checkpoints.ckpt_dir.iterdir())


def test_checkpoint_interval_by_epoch_and_keep(trainer_factory):
    t = trainer_factory(default_hooks=dict(checkpoint=dict(interval=1, max_keep_ckpts=2)), train_cfg=dict(max_epochs=3))
    t.train()
    assert sorted(p.name for p in t.checkpoints.ckpt_dir.glob("*.pth")) == ["epoch_2.pth", "epoch_3.pth"]


def test_checkpoint_by_iteration(trainer_factory):
    t = trainer_factory(
        default_hooks=dict(checkpoint=dict(interval=4, by_epoch=False)), train_cfg=dict(by_epoch=False, max_iters=10)
    )
    t.train()
    # every 4 iterations, plus the last one (save_last)
    assert sorted(p.name for p in t.checkpoints.ckpt_dir.glob("*.pth")) == ["iter_10.pth", "iter_4.pth", "iter_8.pth"]


def test_timer_none_removes_timing(trainer_factory):
    t = trainer_factory(default_hooks=dict(checkpoint=None, timer=None))
    t.train()
    rec = _records(t)[0]
    assert "time" not in rec and "loss" in rec


def test_default_hook_replaced_by_object(trainer_factory):
    mine = LoggerHook(interval=4)
    t = trainer_factory(default_hooks=dict(checkpoint=None, logger=mine))
    t.train()
    assert t.hooks.get(LoggerHook) is mine
    assert [r["iter"] for r in _records(t)] == [4, 8, 10]


def test_custom_hooks_by_object_and_by_dict(trainer_factory):
    obj = EpochCounter()
    t = trainer_factory(custom_hooks=[obj, dict(type="TestEpochCounterHook", start=100)], train_cfg=dict(max_epochs=3))
    # two copies of a stateless hook are fine
    t.train()
    counters = [h for h in t.hooks if isinstance(h, EpochCounter)]
    assert counters[0] is obj and obj.epochs == 3
    assert counters[1].epochs == 103


def test_unknown_default_hook_name_suggests(trainer_factory):
    with pytest.raises(KeyError, match="Did you mean 'logger'"):
        trainer_factory(default_hooks=dict(loger=dict(interval=5)))


def test_unknown_custom_hook_type_suggests(trainer_factory):
    with pytest.raises(KeyError, match="Did you mean 'LoggerHook'"):
        trainer_factory(custom_hooks=[dict(type="LogerHook")])
