"""mmengine's BaseStrategy methods on a strategy: build the parts without a Trainer, resume them from a Trainer's
checkpoint, or load weights only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import LinearReg, make_trainer

from trainwright.strategies import build_strategy

OPTIM = dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9))
SCHED = [
    dict(type="LinearLR", start_factor=0.5, by_epoch=False, begin=0, end=4),
    dict(type="MultiStepLR", milestones=[6], by_epoch=False),
]


def test_a_strategy_builds_the_parts_and_resumes_them_from_a_trainer_checkpoint(tmp_path: Path) -> None:
    trainer = make_trainer(
        tmp_path,
        optim_wrapper=OPTIM,
        param_scheduler=SCHED,
        train_cfg=dict(by_epoch=False, max_iters=5),
        default_hooks=dict(checkpoint=dict(interval=5, by_epoch=False)),
    )
    trainer.train()
    trained = trainer.unwrapped_model
    ckpt_path = tmp_path / "checkpoints" / "iter_5.pth"
    trainer.close()

    strategy = build_strategy("single")
    model = strategy.prepare(strategy.build_model(LinearReg(seed=3)))
    ow = strategy.build_optim_wrapper(OPTIM)
    schedulers = strategy.build_param_scheduler(SCHED, ow, max_iters=10)
    assert isinstance(schedulers, list) and len(schedulers) == 2
    ckpt = strategy.load_or_resume(
        resume=True, ckpt_dir=ckpt_path.parent, optim_wrapper=ow, param_schedulers=schedulers
    )
    assert ckpt is not None and ckpt["progress"]["iteration"] == 5
    for a, b in zip(model.parameters(), trained.parameters()):
        assert torch.equal(a, b)
    assert (
        ow.get_lr()["lr"] == [pytest.approx(0.1)]
        and ow.optimizer.state_dict()["state"][0]["momentum_buffer"] is not None
    )
    assert schedulers[1].state_dict() == trainer.param_schedulers[1].state_dict()

    other = build_strategy("single")
    fresh = other.prepare(other.build_model(dict(type=LinearReg, seed=4)))
    other.load_or_resume(load_from=ckpt_path)  # weights only
    assert torch.equal(fresh.linear.weight, trained.linear.weight)
    torch.save({"model": fresh.state_dict()}, tmp_path / "weights.pth")
    with pytest.raises(KeyError, match=r"has no \['optim_wrapper'\].*load weights only"):
        other.resume(tmp_path / "weights.pth", optim_wrapper=other.build_optim_wrapper(OPTIM))
    with pytest.raises(TypeError, match=r"build_model needs an nn.Module"):
        other.build_model(dict(type=lambda: 3))
