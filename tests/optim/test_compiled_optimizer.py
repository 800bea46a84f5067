"""The compiled optimizer step (``optim_wrapper=dict(..., compile=True)``) trains as the eager step.

AdamW and SGD under a per-iteration learning-rate schedule, 6 steps, compiled vs eager: parameters
within 1e-5 (the compiled step fuses the update in another order; measured 1.4e-6 on weights
of size ~2, a few float32 ulps); the schedule does
not recompile the step (the learning rate is a tensor inside it), and outside the step the
param groups hold floats (what schedulers, the log and checkpoints see). float16 with a
GradScaler steps through the compiled step too. torch.compile on CPU needs a C++ compiler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import NEEDS_COMPILER, LinearReg, make_trainer
from torch import nn

import trainwright as tw
from trainwright.optim.compiled_step import CompiledStep

pytestmark = NEEDS_COMPILER
TOL = 1e-5


class LrLog(tw.Hook):
    """The learning rate each iteration ran with, and its type in the param group (outside the step)."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.lrs: list[Any] = []

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        self.lrs.append(trainer.optim_wrapper.optimizer.param_groups[0]["lr"])


def _run(tmp_path: Path, name: str, compile: bool, **kwargs: Any) -> tuple[tw.Trainer, LrLog, dict[str, torch.Tensor]]:
    log = LrLog()
    kwargs.setdefault("optim_wrapper", dict(optimizer=dict(type="AdamW", lr=0.05, weight_decay=0.01), compile=compile))
    trainer = make_trainer(
        tmp_path / name,
        model=LinearReg(d_in=4, d_out=2),
        batch_size=4,
        train_cfg=dict(by_epoch=False, max_iters=6),
        param_scheduler=dict(type="LinearLR", start_factor=0.2, by_epoch=False, begin=0, end=5),
        custom_hooks=[log],
        dataset=__import__("conftest").regression_set(n=24, d_out=2),
        **kwargs,
    )
    trainer.train()
    state = {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    return trainer, log, state


def _graphs() -> int:
    from torch._dynamo.utils import counters  # test instrumentation: how many graphs dynamo has compiled so far

    return int(counters["stats"]["unique_graphs"])


@pytest.mark.parametrize(
    "optimizer",
    [dict(type="AdamW", lr=0.05, weight_decay=0.01), dict(type="SGD", lr=0.05, momentum=0.9)],
    ids=["AdamW", "SGD"],
)
def test_compiled_step_equals_eager_and_a_schedule_does_not_recompile(
    tmp_path: Path, optimizer: dict[str, Any]
) -> None:
    eager, eager_log, eager_state = _run(tmp_path, "eager", False, optim_wrapper=dict(optimizer=optimizer))
    before = _graphs()
    compiled, log, state = _run(tmp_path, "compiled", True, optim_wrapper=dict(optimizer=optimizer, compile=True))
    assert isinstance(compiled.optim_wrapper.compiled_step, CompiledStep) and eager.optim_wrapper.compiled_step is None
    # the first step compiles, the optimizer state appearing may compile once more; the 4 lr changes compile nothing
    # (with a float lr, torch 2.13 recompiles SGD's step for every new value, up to its limit of 8, then runs it eager)
    assert _graphs() - before <= 2, _graphs() - before
    assert log.lrs == eager_log.lrs and len(set(log.lrs)) >= 4 and all(type(lr) is float for lr in log.lrs)
    assert all(type(g["lr"]) is float for g in compiled.optim_wrapper.optimizer.state_dict()["param_groups"])
    for k in eager_state:
        torch.testing.assert_close(state[k], eager_state[k], atol=TOL, rtol=0, msg=k)
    assert "compile=True" in repr(compiled.optim_wrapper)
    eager.close()
    compiled.close()


def test_float16_grad_scaler_steps_through_the_compiled_step(tmp_path: Path) -> None:
    runs = {}
    for compile in (False, True):
        trainer, _, runs[compile] = _run(
            tmp_path,
            f"fp16_{compile}",
            compile,
            precision="16-mixed",
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9), compile=compile),
        )
        assert trainer.optim_wrapper.precision.scaler is not None
        trainer.close()
    for k in runs[False]:
        torch.testing.assert_close(runs[True][k], runs[False][k], atol=TOL, rtol=0, msg=k)


def test_unknown_compile_argument_is_an_error() -> None:
    opt = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"Unknown optim_wrapper compile key 'mod'.*mode"):
        tw.OptimWrapper(opt, compile=dict(mod="max-autotune"))


def test_foreach_on_the_cpu_keeps_a_float_lr_with_a_warning_and_trains_as_eager(tmp_path: Path) -> None:
    """torch refuses a tensor lr in a non-capturable foreach step (the CPU): the step keeps floats there, and says
    what it costs."""
    opt = dict(type="AdamW", lr=0.05, weight_decay=0.01, foreach=True)
    with pytest.warns(UserWarning, match="foreach=True on the CPU"):
        _, _, compiled = _run(tmp_path, "compiled", True, optim_wrapper=dict(optimizer=opt, compile=True))
    _, _, eager = _run(tmp_path, "eager", False, optim_wrapper=dict(optimizer=opt))
    for k in eager:
        torch.testing.assert_close(compiled[k], eager[k], rtol=1e-5, atol=1e-6)
