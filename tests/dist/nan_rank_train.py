"""A NaN loss on rank 1 of a 2-process DDP run (torchrun, gloo): the worker of tests/dist/test_nan_rank.py.

Usage: nan_rank_train.py OUT_DIR
Rank 1's loss is NaN at iteration 17 (the all-reduced gradients make both ranks' later losses
NaN); agreement points every 10 iterations, so both ranks raise at iteration 20. Each rank
writes OUT_DIR/error_rank<r>.txt (its error message); rank 0's train.log is in OUT_DIR/work/run/.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw

RANK = int(os.environ.get("RANK", 0))
NAN_AT = 17


class Reg(tw.BaseModel):
    def __init__(self, nan_at: int = 0) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.nan_at, self.calls = nan_at, 0

    def forward(self, x, y=None, mode="tensor"):
        out = self.linear(x)
        if mode != "loss":
            return out
        self.calls += 1
        loss = F.mse_loss(out, y)
        return {"loss": loss * float("nan") if self.calls == self.nan_at else loss}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 4, generator=g)
    t = tw.Trainer(
        model=Reg(NAN_AT if RANK == 1 else 0), work_dir=out / "work", experiment_name="run", strategy="ddp",
        train_dataloader=dict(dataset=TensorDataset(x, x @ torch.randn(4, 1, generator=g)), batch_size=4, shuffle=True),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)), train_cfg=dict(by_epoch=False, max_iters=30),
        default_hooks=dict(logger=dict(interval=5), checkpoint=None), randomness=dict(seed=0),
    )
    with t:
        try:
            t.train()
        except FloatingPointError as e:
            (out / f"error_rank{RANK}.txt").write_text(f"{t.progress.iteration}\n{e}")


if __name__ == "__main__":
    main()
