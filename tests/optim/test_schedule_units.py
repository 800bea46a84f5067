"""Schedules in the user's units: per optimizer update (nanoGPT, Hugging Face), per iteration (mmengine), per epoch;
ends that default to the end of training."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import LinearReg, make_trainer, params_of, regression_set
from torch.optim import lr_scheduler as tls
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.optim import OptimWrapper
from trainwright.optim.scheduler import CosineAnnealingLR, LinearLR, build_param_schedulers

LR, MIN_LR, WARMUP, DECAY = (
    0.1,
    0.01,
    3,
    8,
)  # nanoGPT's learning_rate, min_lr, warmup_iters, lr_decay_iters (in updates)
ACC, ITERS = 4, 44  # 11 optimizer updates; the schedule's every phase (warmup, cosine, floor) is crossed


def get_lr(it: int) -> float:
    """nanoGPT's schedule: ``it`` counts optimizer updates."""
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    if it > DECAY:
        return MIN_LR
    decay_ratio = (it - WARMUP) / (DECAY - WARMUP)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return MIN_LR + coeff * (LR - MIN_LR)


def factor(it: int) -> float:
    return get_lr(it) / LR


#: nanoGPT's schedule with trainwright's schedulers, bounds in updates as nanoGPT writes them.
WARMUP_COSINE = [
    dict(type="LinearLR", start_factor=1 / (WARMUP + 1), end=WARMUP + 1, by_update=True),
    dict(type="CosineAnnealingLR", begin=WARMUP, end=DECAY + 1, T_max=DECAY - WARMUP, eta_min=MIN_LR, by_update=True),
]


class LrPerIter(tw.Hook):
    """The learning rate each iteration trains with."""

    def __init__(self) -> None:
        self.lr: list[float] = []

    def before_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None) -> None:
        self.lr.append(trainer.optim_wrapper.optimizer.param_groups[0]["lr"])


def hand_loop(set_lr: Any) -> tuple[list[float], list[torch.Tensor]]:
    """The reference: a plain accumulation loop; ``set_lr(optimizer)`` returns a callback run after each optimizer
    step (or None)."""
    model = LinearReg()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    after_step = set_lr(opt)
    batches = itertools.cycle(list(DataLoader(regression_set(n=16), batch_size=2)))
    lrs = []
    for i in range(ITERS):
        x, y = next(batches)
        lrs.append(opt.param_groups[0]["lr"])
        (F.mse_loss(model.linear(x), y) / ACC).backward()
        if (i + 1) % ACC == 0:
            opt.step()
            opt.zero_grad()
            after_step()
    return lrs, params_of(model)


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Bitwise equal tensors."""
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def run(tmp_path: Path, scheduler: Any, **kw: Any) -> tuple[tw.Trainer, LrPerIter]:
    rec = LrPerIter()
    kw.setdefault("optim_wrapper", dict(optimizer=dict(type="SGD", lr=LR), accumulative_counts=ACC))
    trainer = make_trainer(
        tmp_path,
        dataset=regression_set(n=16),
        train_cfg=dict(by_epoch=False, max_iters=ITERS),
        param_scheduler=scheduler,
        custom_hooks=[rec],
        **kw,
    )
    trainer.train()
    trainer.close()
    return trainer, rec


def test_update_units_equal_a_hand_written_loop_at_every_update(tmp_path: Path) -> None:
    # The lambda, as torch's LambdaLR steps it after every optimizer.step().
    def torch_lambda(opt: torch.optim.Optimizer) -> Any:
        return tls.LambdaLR(opt, factor).step

    want_lr, want_w = hand_loop(torch_lambda)
    assert want_lr == [
        get_lr(i // ACC) for i in range(ITERS)
    ]  # (this schedule's floats happen to equal nanoGPT's get_lr exactly)
    for scheduler in (dict(type="LambdaLR", lr_lambda=factor, by_update=True), lambda opt: tls.LambdaLR(opt, factor)):
        trainer, rec = run(tmp_path, scheduler)
        assert rec.lr == want_lr
        assert same(params_of(trainer.model), want_w)

    # LinearLR + CosineAnnealingLR with nanoGPT's bounds, by_update: as a hand loop steps them after each
    # optimizer.step().
    def stepped(opt: torch.optim.Optimizer) -> Any:
        scheds = build_param_schedulers(
            [{k: v for k, v in c.items() if k != "by_update"} | dict(by_epoch=False) for c in WARMUP_COSINE], opt
        )
        return lambda: [s.step() for s in scheds]

    want_lr, want_w = hand_loop(stepped)
    trainer, rec = run(tmp_path, WARMUP_COSINE)
    assert rec.lr == want_lr
    assert same(params_of(trainer.model), want_w)
    assert rec.lr == pytest.approx(
        [get_lr(i // ACC) for i in range(ITERS)], rel=1e-15, abs=0
    )  # nanoGPT's schedule, to the last bits

    # The same configs without by_update count iterations (mmengine's meaning, unchanged): the warmup ends 4x sooner.
    _, per_iter = run(
        tmp_path, [{k: v for k, v in c.items() if k != "by_update"} | dict(by_epoch=False) for c in WARMUP_COSINE]
    )
    assert per_iter.lr[: DECAY + 2] == pytest.approx([get_lr(i) for i in range(DECAY + 2)], rel=1e-15, abs=0)


def test_the_log_states_each_schedules_unit_once_under_accumulation(tmp_path: Path) -> None:
    scheduler = [
        dict(type="LinearLR", start_factor=0.5, end=4, by_update=True),
        dict(type="MultiStepLR", milestones=[20], by_epoch=False),
        lambda opt: tls.ExponentialLR(opt, gamma=0.9),
    ]
    trainer, _ = run(tmp_path, scheduler, log_level="INFO")
    lines = [
        line for line in (trainer.run_dir / "train.log").read_text().splitlines() if "param_scheduler units" in line
    ]
    assert len(lines) == 1 and " INFO " in lines[0] and "accumulative_counts=4" in lines[0]
    assert (
        "LinearLR counts optimizer updates, MultiStepLR counts iterations, ExponentialLR (torch) counts optimizer "
        "updates" in lines[0]
    )
    plain, _ = run(
        tmp_path,
        [dict(type="MultiStepLR", milestones=[20], by_epoch=False)],
        log_level="INFO",
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=LR)),
    )
    assert (
        "param_scheduler units" not in (plain.run_dir / "train.log").read_text()
    )  # no accumulation, no per-update schedule: nothing to say


def test_linear_and_poly_without_end_end_with_training(tmp_path: Path) -> None:
    # An epoch-based run of 3 epochs x 8 iterations (2 updates of 4 per epoch); no `end` anywhere.
    rec = LrPerIter()
    trainer = make_trainer(
        tmp_path,
        dataset=regression_set(n=16),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        custom_hooks=[rec],
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=LR)),
        param_scheduler=dict(type="LinearLR", start_factor=0.25, by_epoch=False),
    )
    trainer.train()
    trainer.close()
    assert trainer.param_schedulers[0].end == 24
    assert rec.lr == pytest.approx(
        [LR * (0.25 + 0.75 * i / 23) for i in range(24)], rel=1e-14
    )  # reaches LR at the last iteration

    # Per update in an epoch-based run: 2 epochs of 10 iterations, windows closing at iterations 4, 8 and 10 of each
    # epoch.
    rec = LrPerIter()
    trainer = make_trainer(
        tmp_path,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        custom_hooks=[rec],
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=LR), accumulative_counts=4),
        param_scheduler=dict(type="PolyLR", by_update=True),
    )
    trainer.train()
    trainer.close()
    assert trainer.param_schedulers[0].end == 6
    assert rec.lr == pytest.approx(
        [LR * (1 - (3 * e + i // 4) / 5) for e in range(2) for i in range(10)], rel=1e-14, abs=1e-17
    )

    ow = OptimWrapper(torch.optim.SGD(LinearReg().parameters(), lr=LR, momentum=0.9), accumulative_counts=4)
    kw: dict[str, Any] = dict(epoch_length=10, max_epochs=3)
    poly, linear_m, per_epoch = build_param_schedulers(
        [
            dict(type="PolyLR", by_update=True),
            dict(type="LinearMomentum", start_factor=0.5, by_epoch=False),
            dict(type="PolyParamScheduler", param_name="weight_decay"),
        ],
        ow,
        **kw,
    )
    assert (poly.end, linear_m.end, per_epoch.end) == (
        9,
        30,
        3,
    )  # 3 epochs of ceil(10 / 4) updates, of 10 iterations; 3 epochs
    (iter_run,) = build_param_schedulers(dict(type="PolyLR", by_update=True), ow, max_iters=10)
    assert iter_run.end == 3  # updates at iterations 4, 8 and 10 (the short last window)
    with pytest.raises(
        ValueError,
        match=r"LinearLR changes the value over its window, so it needs end=.*a config without end ends with training",
    ):
        LinearLR(ow)  # built by hand, with no training length to default to
    assert isinstance(CosineAnnealingLR(ow, T_max=5), CosineAnnealingLR)


def test_unit_mistakes_are_named(tmp_path: Path) -> None:
    ow = OptimWrapper(torch.optim.SGD(LinearReg().parameters(), lr=LR), accumulative_counts=2)
    with pytest.raises(ValueError, match=r"LinearLR: by_epoch=True and by_update=True name two units; give one"):
        build_param_schedulers(dict(type="LinearLR", end=4, by_epoch=True, by_update=True), ow)
    with pytest.raises(TypeError, match=r"ReduceOnPlateauLR got unknown argument\(s\) \['by_update'\]"):
        build_param_schedulers(dict(type="ReduceOnPlateauLR", monitor="val/loss", by_update=True), ow)
    # convert_to_iter_based with by_update converts epochs to updates: 2 epochs of ceil(5 / 2) = 3 updates.
    (s,) = build_param_schedulers(
        dict(type="LinearLR", end=2, by_update=True, convert_to_iter_based=True), ow, epoch_length=5
    )
    assert (s.end, s.unit) == (6, "update")
