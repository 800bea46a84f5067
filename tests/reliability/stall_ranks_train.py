"""Two DDP processes (gloo): a rank held up, as a stall and under a preemption (torchrun child).

Usage: ``torchrun --nproc_per_node=2 stall_ranks_train.py WORK_DIR``.

1. ``WORK_DIR/run``: rank 1 sleeps 6 s in a hook before iteration 3; the stall timeout is 1 s and the gloo timeout 60 s:
   the stall report must come while rank 0 still waits in its collective, and the run then finishes normally.
2. ``WORK_DIR/preempt``: both ranks get SIGTERM inside the fetch of batch 3, whose read then takes 3 s on rank 1
   (grace_s=1): rank 0, waiting in DDP's all-reduce, must wait for rank 1's fetch rather than exit; both stop at the
   next agreement point (iteration 10) with one checkpoint, and a resumed run ends with the uninterrupted run's weights
   (``WORK_DIR/preempt.json``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import trainwright as tw


class Reg(tw.BaseModel):
    """A linear regression."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)
        with torch.no_grad():  # the same initial weights in every run
            self.lin.weight.copy_(torch.linspace(-1, 1, 4).view(1, 4))
            self.lin.bias.zero_()

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


class NoticeInFetch(Dataset):
    """The ``trap``-th read sends SIGTERM to this process (the cluster's notice reaches every rank); it then takes
    ``slow_s`` (a slow network read on one rank)."""

    def __init__(self, data: TensorDataset, trap: int | None, slow_s: float) -> None:
        self.data, self.trap, self.slow_s, self.reads = data, trap, slow_s, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        self.reads += 1
        if self.reads == self.trap:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(self.slow_s)
        return self.data[i]


def preempt_runs(work: Path, rank: int) -> None:
    """Part 2: the reference, the preempted run and its resume; rank 0 writes ``preempt.json``."""
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))

    def run(folder: str, name: str, trap: bool) -> tw.Trainer:
        t = tw.Trainer(
            model=Reg(),
            work_dir=work / folder,
            experiment_name=name,
            train_dataloader=dict(
                dataset=NoticeInFetch(data, 4 * 2 + 2 if trap else None, 3.0 if rank == 1 else 0.0),
                batch_size=4,
                shuffle=True,
            ),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
            train_cfg=dict(by_epoch=False, max_iters=16),
            default_hooks=dict(
                checkpoint=dict(by_epoch=False, interval=100),
                preemption=dict(exit_code=None, grace_s=1.0),
                stall=None,
            ),
            strategy=dict(type="ddp", timeout_s=60),
            randomness=dict(seed=0),
            resume=True,
        )
        t.train()
        return t

    ref = run("preempt_ref", "run", trap=False)
    expected = {k: v.clone() for k, v in ref.unwrapped_model.state_dict().items()}
    ref.close()
    cut = run("preempt", "run", trap=True)
    hook = next(h for h in cut.hooks if type(h).__name__ == "PreemptionHook")
    result: dict[str, Any] = dict(stopped_at=cut.progress.iteration, seconds=hook.signal_to_checkpoint_s)
    cut.close()
    resumed = run("preempt", "resumed", trap=False)
    got = resumed.unwrapped_model.state_dict()
    result["resumed_iters"] = resumed.progress.iteration
    result["exact"] = all(torch.equal(got[k], v) for k, v in expected.items())
    resumed.close()
    if rank == 0:
        (work / "preempt.json").write_text(json.dumps(result))


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
    preempt_runs(Path(work), rank)


if __name__ == "__main__":
    main()
