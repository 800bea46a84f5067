"""SWAHook equals torch's SWA recipe (AveragedModel, SWALR, update_bn) on a model with BatchNorm; resume mid-SWA is
bitwise."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.hooks import SWAHook


class BNNet(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.net(x)
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(32, 4, generator=g) * 2 + 1
    return TensorDataset(x, (x[:, :1] * x[:, 1:2]).tanh())


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _trainer(work_dir: Path, model: nn.Module, data: TensorDataset, epochs: int = 5, **kwargs: Any) -> tw.Trainer:
    return tw.Trainer(
        model=model,
        work_dir=work_dir,
        train_dataloader=DataLoader(data, batch_size=8, shuffle=kwargs.pop("shuffle", False)),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=epochs),
        custom_hooks=[dict(type="SWAHook", begin_epoch=3, swa_lr=0.02, anneal_epochs=2, anneal_strategy="cos")],
        log_level="WARNING",
        randomness=dict(seed=0),
        **kwargs,
    )


def test_equals_torch_swa_loop(tmp_path: Path) -> None:
    data = _data()
    model = BNNet()
    ref = copy.deepcopy(model)
    t = _trainer(tmp_path, model, data, default_hooks=dict(checkpoint=None))
    t.train()
    t.close()

    # torch's recipe, by hand
    loader = DataLoader(data, batch_size=8)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    swa_model = AveragedModel(ref)
    swa_sched = None
    lrs = []
    for epoch in range(5):
        if epoch == 3 - 1:
            swa_sched = SWALR(opt, swa_lr=0.02, anneal_epochs=2, anneal_strategy="cos")
        ref.train()
        for x, y in loader:
            lrs.append(opt.param_groups[0]["lr"])
            F.mse_loss(ref(x), y).backward()
            opt.step()
            opt.zero_grad()
        if epoch >= 3 - 1:
            swa_model.update_parameters(ref)
            assert swa_sched is not None
            swa_sched.step()
    update_bn(loader, swa_model)

    assert len(set(lrs)) > 2  # SWALR annealed the lr
    expected = swa_model.module.state_dict()
    got = model.state_dict()
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        torch.testing.assert_close(got[k], v, atol=1e-6, rtol=0, msg=k)
    hook = t.hooks.get(SWAHook)
    assert hook.applied and int(hook.averaged.n_averaged) == 3
    # the model is not simply the last training weights: the average differs from them
    assert not torch.allclose(got["net.0.weight"], ref.net[0].weight, atol=1e-6)


@pytest.mark.parametrize("ckpt", ["epoch_3.pth", "iter_14.pth"])
def test_resume_mid_swa_equals_uninterrupted(tmp_path: Path, ckpt: str) -> None:
    data = _data()
    full = BNNet()
    t = _trainer(
        tmp_path / "a",
        full,
        data,
        shuffle=True,
        default_hooks=dict(checkpoint=dict(interval=2, by_epoch=False, save_last=True)),
    )
    t.train()
    t.close()
    if ckpt == "epoch_3.pth":  # an epoch end inside SWA: save epoch checkpoints in a second run of the same
        t = _trainer(tmp_path / "b", BNNet(), data, shuffle=True, default_hooks=dict(checkpoint=dict(interval=1)))
        t.train()
        t.close()
        path = t.checkpoints.ckpt_dir / ckpt
        assert torch.equal(t.unwrapped_model.state_dict()["net.0.weight"], full.state_dict()["net.0.weight"])
    else:  # iteration 14: inside epoch 4 (iterations 13-16), after two average updates
        path = t.checkpoints.ckpt_dir / ckpt
    assert path.exists()
    resumed = BNNet()
    r = _trainer(tmp_path / "c", resumed, data, shuffle=True, resume=str(path), default_hooks=dict(checkpoint=None))
    r.train()
    r.close()
    for k, v in full.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], v), k
    a, b = t.hooks.get(SWAHook), r.hooks.get(SWAHook)
    assert int(a.averaged.n_averaged) == int(b.averaged.n_averaged) == 3
    assert b.schedulers[""].state_dict()["_step_count"] == a.schedulers[""].state_dict()["_step_count"]


def test_iteration_based_run_is_refused(tmp_path: Path) -> None:
    t = tw.Trainer(
        model=BNNet(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(_data(), batch_size=8),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=8),
        custom_hooks=[SWAHook(begin_epoch=1, swa_lr=0.01)],
        default_hooks=dict(checkpoint=None),
        log_level="WARNING",
    )
    with pytest.raises(ValueError, match="use an epoch-based run"):
        t.train()
    t.close()


def test_with_an_ema_hook_is_refused_before_training(tmp_path: Path) -> None:
    t = tw.Trainer(
        model=BNNet(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(_data(), batch_size=8),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        custom_hooks=[SWAHook(begin_epoch=1, swa_lr=0.01), dict(type="EMAHook")],
        default_hooks=dict(checkpoint=None),
        log_level="WARNING",
    )
    with pytest.raises(
        ValueError, match="SWAHook and EMAHook in one run: both swap averaged weights into the model for evaluation"
    ):
        t.train()
    assert t.progress.iteration == 0
    t.close()


def test_begin_after_the_run_is_refused(tmp_path: Path) -> None:
    t = _trainer(tmp_path, BNNet(), _data(), epochs=2, default_hooks=dict(checkpoint=None))
    with pytest.raises(ValueError, match="begin_epoch=3 starts averaging after epoch 3, but the run has 2 epochs"):
        t.train()
    t.close()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(begin_epoch=0, swa_lr=0.1), "begin_epoch must be an int >= 1"),
        (dict(begin_epoch=1, swa_lr=-1.0), "swa_lr must be a number > 0"),
        (dict(begin_epoch=1, swa_lr=0.1, anneal_strategy="exp"), "anneal_strategy must be 'cos' or 'linear'"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        SWAHook(**kwargs)


def test_a_scheduler_running_into_swa_is_named(tmp_path: Path) -> None:
    t = _trainer(
        tmp_path,
        BNNet(),
        _data(),
        epochs=3,
        default_hooks=dict(checkpoint=None),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.5, by_epoch=True, begin=0, end=2),
            dict(type="MultiStepLR", milestones=[1], by_epoch=True),
        ],
    )
    t.train()
    t.close()
    log = (t.run_dir / "train.log").read_text()
    assert "the learning-rate schedulers ['MultiStepLR'] run past its start and would fight SWALR" in log
