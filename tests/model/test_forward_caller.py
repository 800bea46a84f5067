"""Which callable runs the forward: decided once per run by the strategy, honoured by every step."""

from __future__ import annotations

import copy
import pickle

import torch
from conftest import LinearReg, regression_set
from torch import nn
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.optim import OptimWrapper


class CountingWrapper(nn.Module):
    """Stands in for a DDP wrapper: holds the model, counts the forwards it sees."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.module(*args, **kwargs)


def test_train_step_goes_through_the_bound_wrapper_and_eval_does_not() -> None:
    model = LinearReg()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    wrapper = CountingWrapper(model)
    batch = (torch.randn(4, 4), torch.randn(4, 1))
    model.set_forward_caller(wrapper)
    model.train_step(batch, ow)
    model.train_step(batch, ow)
    model.val_step(batch)  # validation calls the model itself, as mmengine's DDP wrapper does
    assert wrapper.calls == 2
    # the wrapper is not registered as a submodule of the model it wraps (no cycle in modules())
    assert all(m is not wrapper for m in model.modules())


def test_bound_model_still_copies_and_pickles_without_the_wrapper() -> None:
    model = LinearReg()
    model.set_forward_caller(CountingWrapper(model))
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone.forward_caller is None
        torch.testing.assert_close(clone.linear.weight, model.linear.weight)
        out = clone.train_step(
            (torch.randn(2, 4), torch.randn(2, 1)), OptimWrapper(torch.optim.SGD(clone.parameters(), lr=0.1))
        )
        assert set(out) == {"loss"}


def test_hooks_registered_between_runs_and_after_training_fire(tmp_path) -> None:
    """The decision is taken at every run start and dropped at its end: no stale shortcut skips a hook."""
    model = LinearReg()
    seen: list[str] = []
    trainer = tw.Trainer(
        model=model,
        work_dir=tmp_path,
        train_dataloader=DataLoader(regression_set(16), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=4),
        default_hooks=dict(checkpoint=None, logger=None),
    )
    trainer.train()
    assert seen == []
    handle = model.register_forward_pre_hook(lambda m, args: seen.append("second run"))
    trainer.train_loop._max_iters = 6  # noqa: SLF001 - continue the same trainer for two more iterations
    trainer.train()
    assert seen == ["second run", "second run"]
    handle.remove()
    model.register_forward_pre_hook(lambda m, args: seen.append("after"))
    model.train_step((torch.randn(2, 4), torch.randn(2, 1)), trainer.optim_wrapper)
    assert seen[-1] == "after"
    trainer.close()
