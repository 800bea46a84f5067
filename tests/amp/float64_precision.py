"""A precision written outside trainwright ("64-true": weights and inputs in float64), registered by name, and a run of
it.

Imported by ``test_precision_room.py`` (the class, the model, the data); run under torchrun
(``python -m torch.distributed.run --nproc_per_node=2 float64_precision.py OUT``) it trains
with ``strategy="ddp"`` and writes ``OUT/result_rank<r>.pt`` (the final parameters and the
run's precision name).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw
from trainwright.amp import Precision, cast_tensor_type, register_precision


def _inputs_to_float64(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    return cast_tensor_type(args, None, torch.float64), cast_tensor_type(kwargs, None, torch.float64)


class Float64Precision(Precision):
    """Train in float64: the model's weights are cast when the strategy prepares it, its inputs by a forward
    pre-hook."""

    plain = False
    dtype = torch.float64
    name = "64-true"

    def convert_module(self, model: nn.Module) -> None:  # noqa: D102
        model.double()
        model.register_forward_pre_hook(_inputs_to_float64, with_kwargs=True)

    def clone(self) -> Float64Precision:  # noqa: D102
        return Float64Precision()


register_precision("64-true", lambda device_type: Float64Precision(), force=True)


class Reg(tw.BaseModel):
    """4 → 1 linear regression with a seeded initialisation."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.linear = nn.Linear(4, 1)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(1, 4, generator=g))
            self.linear.bias.copy_(torch.randn(1, generator=g))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:  # noqa: D102
        out = self.linear(x)
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def dataset() -> TensorDataset:
    """64 float32 samples of a noisy linear function."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    return TensorDataset(x, x @ torch.randn(4, 1, generator=g) + 0.1 * torch.randn(64, 1, generator=g))


def train(work_dir: str | Path, batch_size: int, iters: int, strategy: str) -> tw.Trainer:
    """Train ``Reg`` with ``precision="64-true"`` (SGD with momentum, no shuffling); returns the trainer, trained."""
    trainer = tw.Trainer(
        model=Reg(),
        work_dir=work_dir,
        train_dataloader=dict(dataset=dataset(), batch_size=batch_size, shuffle=False),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        default_hooks=dict(checkpoint=None),
        precision="64-true",
        strategy=strategy,
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    out = Path(sys.argv[1])
    trainer = train(out, batch_size=4, iters=int(sys.argv[2]), strategy="ddp")
    params = {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    torch.save(
        {
            "params": params,
            "precision": trainer.precision.name,
            "strategy": trainer.strategy.name,
            "world_size": trainer.strategy.world_size,
        },
        out / f"result_rank{os.environ.get('RANK', '0')}.pt",
    )
    trainer.close()
