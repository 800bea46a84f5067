"""Two DDP processes (gloo) where rank 1 sleeps in a hook before iteration 3: the stall test's run (torchrun child).

Usage: ``torchrun --nproc_per_node=2 stall_ranks_train.py WORK_DIR``. The stall timeout is 1 s, rank 1 sleeps 6 s and
the gloo timeout is 60 s: the stall report must come while rank 0 still waits in its collective, and the run then
finishes normally.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw


class Reg(tw.BaseModel):
    """A linear regression."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor"):  # noqa: D102
        out = self.lin(x)
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


class SleepyHook(tw.Hook):
    """Sleeps before this process's iteration ``at`` (a rank held up in user code)."""

    def __init__(self, at: int, seconds: float) -> None:
        self.at, self.seconds = at, seconds

    def before_train_iter(self, trainer, batch_idx, data_batch=None) -> None:  # noqa: D102
        if trainer.progress.iteration + 1 == self.at:
            held_up_in_user_code(self.seconds)


def held_up_in_user_code(seconds: float) -> None:
    time.sleep(seconds)


def main() -> None:
    work = sys.argv[1]
    rank = int(os.environ["RANK"])
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    trainer = tw.Trainer(
        model=Reg(),
        work_dir=work,
        experiment_name="run",
        train_dataloader=dict(dataset=data, batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=5),
        default_hooks=dict(checkpoint=None, stall=dict(timeout_s=1.0), logger=dict(interval=1)),
        strategy=dict(type="ddp", timeout_s=60),
        custom_hooks=[SleepyHook(at=3, seconds=6.0)] if rank == 1 else [],
        randomness=dict(seed=0),
    )
    trainer.train()
    trainer.close()


if __name__ == "__main__":
    main()
