"""2-process gloo worker of tests/dist/test_sync_buffers.py: BatchNorm statistics with and without SyncBuffersHook.

Usage: buffers_train.py OUT_DIR. For DDP with ``broadcast_buffers=False`` (mmengine's default wrapper) and for FSDP, one
epoch of the same model and data without the hook, then with it; writes OUT_DIR/buffers_rank<r>.pt, each run's
BatchNorm running mean and variance on this rank.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from conftest import BNReg  # noqa: E402

RANK = int(os.environ.get("RANK", 0))


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g) * torch.linspace(0.5, 3, 64).unsqueeze(1)  # ranks' shards have other statistics
    return TensorDataset(x, x.sum(1, keepdim=True))


def main() -> None:
    out = Path(sys.argv[1])
    results = {}
    for strategy in (dict(type="ddp", broadcast_buffers=False), dict(type="fsdp")):
        for hooks in ([], [dict(type="SyncBuffersHook")]):
            torch.manual_seed(0)
            t = tw.Trainer(
                model=BNReg(), work_dir=out / "work", strategy=strategy, custom_hooks=hooks,
                train_dataloader=dict(dataset=data(), batch_size=8, shuffle=False), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
                train_cfg=dict(by_epoch=True, max_epochs=1), default_hooks=dict(checkpoint=None), randomness=dict(seed=0), log_level="WARNING",
            )
            t.train()
            bn = t.unwrapped_model.bn
            results[(strategy["type"], bool(hooks))] = (bn.running_mean.detach().clone(), bn.running_var.detach().clone())
            t.close()
    torch.save(results, out / f"buffers_rank{RANK}.pt")


if __name__ == "__main__":
    main()
