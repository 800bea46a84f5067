"""Under torchrun: rank 1 alone receives SIGTERM in the middle of a validation; both ranks must leave it at the same
batch.

Usage: ddp_val_stop.py WORK_DIR. Writes WORK_DIR/result_rank<r>.json.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw

sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import LinearReg  # noqa: E402


class Notice(tw.Hook):
    """Counts validation batches; rank 1 alone gets the cluster's SIGTERM at batch 3 of the first validation."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.batches = 0

    def after_val_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        self.batches += 1
        if self.rank == 1 and batch_idx == 3 and trainer.progress.epoch == 1:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    work = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
    val = TensorDataset(torch.randn(200, 4, generator=g), torch.randn(200, 1, generator=g))
    notice = Notice(rank)
    t = tw.Trainer(
        model=LinearReg(),
        work_dir=work,
        train_dataloader=dict(dataset=train, batch_size=4),
        val_dataloader=DataLoader(val, batch_size=2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(preemption=dict(exit_code=None)),
        custom_hooks=[notice],
        log_level="WARNING",
        randomness=dict(seed=0),
    )
    with t:
        t.train()
        result = {
            "val_batches": notice.batches,
            "preempted": t.preempted,
            "epoch": t.progress.epoch,
            "iteration": t.progress.iteration,
        }
    (work / f"result_rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
