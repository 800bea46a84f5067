"""EMAHook(update_per="update"): the average follows the optimizer's updates under accumulation, as timm's training
loop does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.hooks.ema import EMAHook

ACC, ITERS, MOMENTUM = 2, 10, 0.25


class Net(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.b(torch.tanh(self.a(x)))
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(4 * ITERS, 4, generator=g), torch.randn(4 * ITERS, 1, generator=g))


def timm_loop() -> dict[str, torch.Tensor]:
    """timm's train_one_epoch, by hand: loss / accum backward each micro-batch; on the last of each window step,
    zero_grad, then update the EMA.

    The average's first update copies the weights, later ones move it by ``MOMENTUM`` toward
    them (trainwright's convention: the weight of the new value).
    """
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = data().tensors
    avg: dict[str, torch.Tensor] | None = None
    for i in range(ITERS):
        (model(x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4], mode="loss")["loss"] / ACC).backward()
        if (i + 1) % ACC == 0:
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                if avg is None:
                    avg = {k: v.detach().clone() for k, v in model.state_dict().items()}
                else:
                    for k, v in model.state_dict().items():
                        avg[k].lerp_(v, MOMENTUM)
    assert avg is not None
    return avg


def test_ema_per_update_equals_a_timm_style_loop_bitwise(tmp_path: Path) -> None:
    """accumulative_counts=2: the average updated after each optimizer update equals timm's loop bit for bit; per
    iteration it differs."""
    averages = {}
    for update_per in ("update", "iter"):
        hook = EMAHook(momentum=MOMENTUM, update_per=update_per)
        t = tw.Trainer(
            model=Net(),
            work_dir=tmp_path,
            train_dataloader=DataLoader(data(), batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9), accumulative_counts=ACC),
            train_cfg=dict(by_epoch=False, max_iters=ITERS),
            default_hooks=dict(checkpoint=None),
            custom_hooks=[hook],
            log_level="WARNING",
            experiment_name=update_per,
        )
        t.train()
        t.close()
        assert hook.ema is not None
        averages[update_per] = hook.ema.state_dict()["averaged"]
    reference = timm_loop()
    assert all(torch.equal(averages["update"][k], v) for k, v in reference.items())
    assert not all(
        torch.equal(averages["iter"][k], v) for k, v in reference.items()
    )  # the default: mmengine's, per iteration


def test_update_per_is_checked() -> None:
    with pytest.raises(ValueError, match="update_per must be 'iter'"):
        EMAHook(update_per="step")
