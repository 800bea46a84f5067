"""torch's LRSchedulers (objects and factories) and LambdaLR configs in a Trainer: stepped per update, resumed
exactly; the clear errors."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import LinearReg, make_trainer, params_of, regression_set
from torch.optim import lr_scheduler as tls

import trainwright as tw
from trainwright.optim import OptimWrapper
from trainwright.optim.scheduler import TorchScheduler, build_param_schedulers

LR, ACC, ITERS, HALF = 0.1, 2, 16, 8


def factor(it: int) -> float:
    """A warmup then a cosine, over optimizer updates (8 in the run)."""
    return (it + 1) / 3 if it < 2 else 0.5 * (1 + math.cos(math.pi * (it - 2) / 6))


class LrPerIter(tw.Hook):
    def __init__(self) -> None:
        self.lr: list[float] = []

    def before_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None) -> None:
        self.lr.append(trainer.optim_wrapper.optimizer.param_groups[0]["lr"])


def run(work: Path, form: str, resume: Path | None = None) -> tuple[tw.Trainer, LrPerIter]:
    """A run of ITERS iterations (checkpoint at HALF) with the schedule given in ``form``; a new model, optimizer and
    lambda each time."""
    model = LinearReg()
    lam = lambda it: factor(it)  # noqa: E731 - a lambda, as users write it: torch's state_dict cannot save it
    optim_wrapper: Any = dict(optimizer=dict(type="SGD", lr=LR), accumulative_counts=ACC)
    scheduler: Any
    if form == "object":
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        optim_wrapper, scheduler = dict(optimizer=opt, accumulative_counts=ACC), tls.LambdaLR(opt, lam)
    elif form == "factory":
        scheduler = lambda optimizer: tls.LambdaLR(optimizer, lam)  # noqa: E731
    elif form == "torch class":
        scheduler = dict(type=tls.LambdaLR, lr_lambda=lam)
    else:
        scheduler = dict(type="LambdaLR", lr_lambda=lam, by_update=True)
    rec = LrPerIter()
    trainer = make_trainer(
        work,
        model=model,
        dataset=regression_set(n=12),
        train_cfg=dict(by_epoch=False, max_iters=ITERS),
        optim_wrapper=optim_wrapper,
        param_scheduler=scheduler,
        custom_hooks=[rec],
        default_hooks=dict(checkpoint=dict(interval=HALF, by_epoch=False, max_keep_ckpts=-1)),
        resume=str(resume) if resume else False,
    )
    trainer.train()
    trainer.close()
    return trainer, rec


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("form", ["object", "factory", "torch class", "config"])
def test_lambda_schedules_step_per_update_and_resume_exactly(tmp_path: Path, form: str) -> None:
    full, rec = run(tmp_path / "full", form)
    assert rec.lr == [
        LR * factor(i // ACC) for i in range(ITERS)
    ]  # torch's LambdaLR formula, once per optimizer update
    ckpt = full.ckpt_dir / f"iter_{HALF}.pth"
    resumed, rec2 = run(tmp_path / "resumed", form, resume=ckpt)
    assert rec2.lr == rec.lr[HALF:]
    assert same(params_of(resumed.model), params_of(full.model))
    (got,), (want,) = resumed.param_schedulers, full.param_schedulers
    assert got.get_last_value() == want.get_last_value() and got.state_dict() == want.state_dict()


def test_torch_scheduler_mistakes_are_named(tmp_path: Path) -> None:
    model = LinearReg()
    other = torch.optim.SGD(LinearReg().parameters(), lr=LR)
    trainer = make_trainer(tmp_path, model=model, param_scheduler=tls.LambdaLR(other, factor))
    with pytest.raises(
        ValueError,
        match=r"The LambdaLR given as param_scheduler drives another optimizer object .* Build it on the run's "
        r"optimizer: pass a factory",
    ):
        trainer.train()
    trainer.close()

    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=LR))
    cases: list[tuple[Any, type[Exception], str]] = [
        (lambda opt: None, TypeError, r"factory .* returned NoneType, not a torch LRScheduler"),
        (
            tls.LambdaLR,
            TypeError,
            r"param_scheduler got the class LambdaLR; give a torch LRScheduler .* or a config dict, e\.g\. "
            r"dict\(type=torch",
        ),
        (
            lambda opt: tls.ReduceLROnPlateau(opt),
            ValueError,
            r"ReduceLROnPlateau needs the validation metrics .* use trainwright's dict\(type='ReduceOnPlateauLR'",
        ),
        (
            dict(type=tls.StepLR, step_size=2, by_epoch=True, by_update=True),
            ValueError,
            r"by_epoch=True and by_update=True name two units",
        ),
        (
            dict(type="LambdaLR", lr_lambda=lambda it: torch.tensor(0.5)),
            TypeError,
            r"LambdaLR: the schedule function returned Tensor .* at step 0; it must return a number",
        ),
        (dict(type="LambdaLR", lr_lambda=0.5), TypeError, r"LambdaLR: the schedule must be a function of the step"),
    ]
    for cfg, error, message in cases:
        with pytest.raises(error, match=message):
            build_param_schedulers(cfg, ow)
    # A list of torch schedulers (the original `'LambdaLR' object is not iterable`), in their declared units.
    sched = tls.LambdaLR(ow.optimizer, factor)
    built = build_param_schedulers(
        [sched, dict(type="TorchScheduler", scheduler=lambda o: tls.StepLR(o, 3), by_epoch=True)], ow
    )
    assert [(type(s), s.unit) for s in built] == [(TorchScheduler, "update"), (TorchScheduler, "epoch")]


def test_torch_schedulers_per_iteration_and_per_epoch_equal_a_hand_loop_without_warnings(tmp_path: Path) -> None:
    # Per iteration under accumulation the scheduler steps before the first optimizer.step(): deliberate, so torch's
    # order warning is not shown (warnings are errors here); per epoch through dict(type=<torch class>, by_epoch=True).
    rec = LrPerIter()
    scheduler = [
        dict(type="TorchScheduler", scheduler=lambda o: tls.StepLR(o, 3), by_update=False),
        dict(type=tls.ExponentialLR, gamma=0.9, by_epoch=True),
    ]
    trainer = make_trainer(
        tmp_path,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=LR), accumulative_counts=ACC),
        param_scheduler=scheduler,
        custom_hooks=[rec],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.train()
    trainer.close()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    per_iter, per_epoch = tls.StepLR(opt, 3), tls.ExponentialLR(opt, gamma=0.9)
    want = []
    for _epoch in range(2):
        for _i in range(10):
            want.append(opt.param_groups[0]["lr"])
            opt.step()
            per_iter.step()
        per_epoch.step()
    assert rec.lr == want
    assert [s.unit for s in trainer.param_schedulers] == ["iter", "epoch"]
