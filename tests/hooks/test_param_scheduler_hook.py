"""ParamSchedulerHook in real Trainer runs: metric-driven schedulers, no misuse warnings, resume."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_trainer, regression_set
from torch.optim import lr_scheduler as tls
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.evaluation.metric import Metric
from trainwright.hooks.hook import Hook

LR = 0.05


class MSE(Metric):
    batched_results = True

    def process(self, data_batch: Any, outputs: Any) -> None:
        self.results.append(((outputs - data_batch[1]) ** 2).mean(1))

    def compute(self, results: list[torch.Tensor]) -> dict[str, float]:
        return {"mse": float(torch.cat(results).mean())}


class Record(Hook):
    """The learning rate each epoch trains with, and each validation's metrics."""

    def __init__(self) -> None:
        self.lr: list[float] = []
        self.metrics: list[dict[str, float]] = []

    def before_train_epoch(self, trainer: Any) -> None:
        self.lr.append(trainer.optim_wrapper.optimizer.param_groups[0]["lr"])

    def after_val_epoch(self, trainer: Any, metrics: dict[str, float] | None = None) -> None:
        self.metrics.append(dict(metrics or {}))


class CrashAt(Hook):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def before_train_epoch(self, trainer: Any) -> None:
        if trainer.progress.epoch == self.epoch:
            raise RuntimeError("crash")


PLATEAU = dict(type="ReduceOnPlateauLR", monitor="val/mse", rule="less", patience=0, threshold=0.3, factor=0.5)


def _trainer(work: Path, hooks: list[Hook], scheduler: Any = None, max_epochs: int = 6, **kw: Any) -> tw.Trainer:
    kw.setdefault("optim_wrapper", dict(optimizer=dict(type="SGD", lr=LR)))
    return make_trainer(
        work,
        dataset=regression_set(n=16),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs, val_interval=1),
        val_dataloader=DataLoader(regression_set(n=8, seed=5), batch_size=4),
        val_evaluator=MSE(),
        param_scheduler=scheduler if scheduler is not None else [PLATEAU],
        custom_hooks=hooks,
        **kw,
    )


def test_reduce_on_plateau_in_a_run_equals_torch_fed_the_same_metrics(tmp_path: Path) -> None:
    rec = Record()
    trainer = _trainer(tmp_path, [rec])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no misuse warning (nor any other) from a plain run
        trainer.train()
    trainer.close()
    assert len(rec.metrics) == 6 and all("val/mse" in m for m in rec.metrics)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    ref = tls.ReduceLROnPlateau(opt, mode="min", patience=0, threshold=0.3, factor=0.5)
    want = [LR]
    for m in rec.metrics[:-1]:  # validation e sets the lr of epoch e + 1
        ref.step(m["val/mse"])
        want.append(opt.param_groups[0]["lr"])
    assert rec.lr == want
    assert min(want) < LR, "the run must hit a plateau"


def test_standalone_validation_does_not_step_the_plateau(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, [], scheduler=[dict(PLATEAU, threshold=0.99)], max_epochs=2)
    trainer.train()
    (sched,) = trainer.param_schedulers
    state = dict(sched.state_dict())
    lr = trainer.optim_wrapper.optimizer.param_groups[0]["lr"]
    trainer.val()
    trainer.val()
    assert sched.state_dict() == state and trainer.optim_wrapper.optimizer.param_groups[0]["lr"] == lr
    trainer.close()


def test_missing_monitor_names_the_key_the_metrics_and_the_fix(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, [], scheduler=[dict(PLATEAU, monitor="val/acc")])
    with pytest.raises(
        KeyError,
        match=r"monitor 'val/acc' is not among the validation metrics \['val/mse'\].*Set monitor to one of them",
    ):
        trainer.train()
    trainer.close()


def test_resume_mid_run_equals_uninterrupted(tmp_path: Path) -> None:
    scheduler = [
        dict(PLATEAU, cooldown=1),
        dict(type="CosineRestartLR", periods=[2, 3], restart_weights=[1.0, 0.5], eta_min_ratio=0.1),
    ]
    ckpt = dict(checkpoint=dict(type="CheckpointHook", interval=1, by_epoch=True, max_keep_ckpts=-1))
    ref_rec = Record()
    ref = _trainer(tmp_path / "ref", [ref_rec], scheduler=scheduler, default_hooks=ckpt)
    ref.train()
    ref.close()

    crashed = _trainer(
        tmp_path / "work", [Record(), CrashAt(3)], scheduler=scheduler, default_hooks=ckpt, experiment_name="a"
    )
    with pytest.raises(RuntimeError, match="crash"):
        crashed.train()
    path = crashed.ckpt_dir / "epoch_3.pth"
    crashed.close()
    assert path.exists()
    rec = Record()
    resumed = _trainer(
        tmp_path / "work", [rec], scheduler=scheduler, default_hooks=ckpt, experiment_name="b", resume=str(path)
    )
    resumed.train()
    resumed.close()
    assert rec.lr == ref_rec.lr[3:]
    for got, want in zip(resumed.param_schedulers, ref.param_schedulers):
        assert got.state_dict() == want.state_dict()
    assert len(set(ref_rec.lr)) > 3  # both schedules moved the lr


def test_iteration_scheduler_with_accumulation_does_not_warn(tmp_path: Path) -> None:
    # With accumulation the optimizer first steps at iteration 2, after the scheduler's first step:
    # fine inside the trainer, which orders the calls itself.
    trainer = _trainer(
        tmp_path,
        [],
        scheduler=[
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, end=4),
            dict(type="ReduceOnPlateauLR", monitor="val/mse", by_epoch=False),
        ],
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=LR), accumulative_counts=2),
        max_epochs=2,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.train()
    trainer.close()
    # Its window ends with training (mmengine's default end: max_epochs * len(loader) = 8 iterations), so the
    # validation after the last iteration falls outside it, as in an iteration-based run.
    assert trainer.param_schedulers[1].end == 8
    assert trainer.param_schedulers[1]._global_step == 8 and trainer.param_schedulers[1].last_step == 0


@pytest.mark.parametrize("by_epoch", [False, True])
def test_plateau_in_an_iteration_based_run(tmp_path: Path, by_epoch: bool) -> None:
    # by_epoch=False: the window is [0, max_iters); by_epoch=True (mmengine's only choice): no epoch
    # ever ends, the window [0, inf) holds every validation, and no "would never step" warning.
    rec = Record()
    trainer = make_trainer(
        tmp_path,
        dataset=regression_set(n=16),
        batch_size=4,
        train_cfg=dict(by_epoch=False, max_iters=12, val_interval=2),
        val_dataloader=DataLoader(regression_set(n=8, seed=5), batch_size=4),
        val_evaluator=MSE(),
        param_scheduler=[dict(PLATEAU, by_epoch=by_epoch)],
        custom_hooks=[rec],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.train()
    (sched,) = trainer.param_schedulers
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    ref = tls.ReduceLROnPlateau(opt, mode="min", patience=0, threshold=0.3, factor=0.5)
    # by_epoch=False: the validation at iteration 12, after the last step, falls outside the window.
    counted = 6 if by_epoch else 5
    for m in rec.metrics[:counted]:
        ref.step(m["val/mse"])
    assert len(rec.metrics) == 6 and sched.last_step == counted - 1
    assert trainer.optim_wrapper.optimizer.param_groups[0]["lr"] == opt.param_groups[0]["lr"] < LR
    trainer.close()
