"""Train loops: counters, data seen, and the scheduled learning rate at every iteration."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import regression_set

import trainwright as tw


class BatchRecorder(tw.Hook):
    def __init__(self) -> None:
        self.batches: list[torch.Tensor] = []
        self.lrs: list[float] = []
        self.idx: list[int] = []

    def before_train_iter(self, trainer, batch_idx, data_batch=None):
        self.batches.append(data_batch[0].clone())
        self.idx.append(batch_idx)
        self.lrs.append(trainer.optim_wrapper.get_lr()["lr"][0])


def _rows(ds) -> dict[tuple[float, ...], int]:
    return {tuple(r.tolist()): i for i, r in enumerate(ds.tensors[0])}


def test_epoch_loop_counters_and_each_sample_once_per_epoch(trainer_factory):
    ds = regression_set(20)
    rec = BatchRecorder()
    t = trainer_factory(
        dataset=ds, batch_size=4, shuffle=True, train_cfg=dict(by_epoch=True, max_epochs=3), custom_hooks=[rec]
    )
    t.train()
    assert (t.progress.epoch, t.progress.iteration, t.progress.iter_in_epoch) == (3, 15, 0)
    assert t.train_loop.max_iters == 15
    assert rec.idx == list(range(5)) * 3
    index = _rows(ds)
    orders = []
    for e in range(3):
        seen = [index[tuple(r.tolist())] for b in rec.batches[5 * e : 5 * e + 5] for r in b]
        assert sorted(seen) == list(range(20))
        orders.append(seen)
    assert orders[0] != orders[1] != orders[2]  # reshuffled every epoch


def test_iteration_loop_counters_and_cycling(trainer_factory):
    ds = regression_set(20)
    rec = BatchRecorder()
    t = trainer_factory(dataset=ds, batch_size=4, train_cfg=dict(by_epoch=False, max_iters=13), custom_hooks=[rec])
    t.train()
    assert t.progress.iteration == 13 and t.train_loop.max_iters == 13
    assert t.progress.epoch == 2  # two full passes over the 5-batch loader, third under way
    assert len(rec.batches) == 13
    for i in range(13):  # shuffle=False: iteration i sees batch i % 5
        assert torch.equal(rec.batches[i], ds.tensors[0][4 * (i % 5) : 4 * (i % 5) + 4])
    assert rec.idx == [0, 1, 2, 3, 4] * 2 + [0, 1, 2]


def test_trainer_returns_trained_user_model(trainer_factory):
    t = trainer_factory()
    model = t.unwrapped_model
    before = model.linear.weight.detach().clone()
    out = t.train()
    assert out is model and t.unwrapped_model is model
    assert not torch.equal(before, model.linear.weight)


def _closed_form_lr(i: int, epoch_len: int, base: float = 0.1, warm: int = 50, epochs: int = 10) -> float:
    """LinearLR(start_factor=0.1, iterations [0, 50)) x CosineAnnealingLR(epochs [0, 10)) at iteration i."""
    w = 0.1 + 0.9 * min(i, warm - 1) / (warm - 1)
    e = i // epoch_len
    return base * w * (1 + math.cos(math.pi * e / epochs)) / 2


def test_issue_schedule_lr_at_every_iteration(trainer_factory):
    """The issue's example: warmup by iteration chained with cosine by epoch; seen and logged lr == closed form."""
    ds = regression_set(48)  # 8 iterations per epoch, warmup spans 6+ epochs
    rec = BatchRecorder()
    t = trainer_factory(
        dataset=ds,
        batch_size=6,
        custom_hooks=[rec],
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=50),
            dict(type="CosineAnnealingLR", by_epoch=True, begin=0, end=10),
        ],
        train_cfg=dict(by_epoch=True, max_epochs=10),
        default_hooks=dict(checkpoint=None, logger=dict(interval=1)),
    )
    t.train()
    expected = [_closed_form_lr(i, 8) for i in range(80)]
    assert rec.lrs == pytest.approx(expected, rel=1e-9, abs=1e-12)
    logged = [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    logged_lr = {r["iter"]: r["lr"] for r in logged if r["mode"] == "train"}
    assert sorted(logged_lr) == list(range(1, 81))
    assert [logged_lr[k] for k in range(1, 81)] == pytest.approx(expected, rel=1e-9, abs=1e-12)
