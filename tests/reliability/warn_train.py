"""A 2-process DDP run (torchrun, gloo) that gives warnings about the run and one about rank 1: the worker of
test_warnings_once.py.

Usage: warn_train.py WORK_DIR
About the run (every rank sees it): a scheduler window after the end of training and an
epoch-based scheduler in an iteration-based run (Python warnings), and an epoch-counting checkpoint interval in an
iteration-based run (a log warning).
About rank 1 alone: it is given another seed (``rank 1 was given seed ...``).
"""

from __future__ import annotations

import os
import sys

import torch
from torch.utils.data import TensorDataset

import trainwright as tw

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from conftest import LinearReg  # noqa: E402

RANK = int(os.environ.get("RANK", 0))

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
with tw.Trainer(
    model=LinearReg(),
    work_dir=sys.argv[1],
    train_dataloader=dict(dataset=data, batch_size=2),
    optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
    train_cfg=dict(by_epoch=False, max_iters=4),
    param_scheduler=[
        dict(type="ConstantLR", factor=0.5, by_epoch=False, begin=100, end=200),
        dict(type="LinearLR", start_factor=0.5, by_epoch=True, end=2),
    ],
    default_hooks=dict(checkpoint=dict(by_epoch=True, interval=1)),
    randomness=dict(seed=5 + RANK),
    log_level="INFO",
) as trainer:
    trainer.train()
print(f"rank {RANK} done", flush=True)
