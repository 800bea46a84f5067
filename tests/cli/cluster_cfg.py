"""A config for the cluster tests (tests/cli/test_cluster.py): ``trainwright train tests/cli/cluster_cfg.py``.

A small MLP with dropout on shuffled Gaussian blobs, 2 epochs, checkpoints every 4
iterations, resumed from the work dir when there is one. ``ClusterReport`` prints
``iter <n>`` after every iteration (flushed: the test times its signals by it), sleeps
``CLUSTER_ITER_SLEEP`` seconds per step, and when training ends without preemption writes
``result_rank<r>.pt`` (the final model state, whether torchrun started it) into the work dir.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw
from trainwright.registry import DATASETS, HOOKS, MODELS


@MODELS.register()
class ClusterNet(tw.BaseModel):
    """16 -> 32 -> 4 MLP with dropout."""

    def __init__(self, dropout: float = 0.3) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor"):  # noqa: D102
        logits = self.net(x)
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, y)}
        return logits


@DATASETS.register()
class ClusterBlobs(TensorDataset):
    """4 Gaussian blobs in 16-d, ``n`` samples (seeded)."""

    def __init__(self, n: int = 192, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        y = torch.randint(0, 4, (n,), generator=g)
        centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(123)) * 2
        super().__init__(centers[y] + torch.randn(n, 16, generator=g), y)


@HOOKS.register()
class ClusterReport(tw.Hook):
    """Progress lines for the test, a per-step sleep, the final weights on disk."""

    priority = "HIGHEST"

    def before_train_iter(self, trainer, batch_idx, data_batch=None) -> None:  # noqa: D102
        time.sleep(float(os.environ.get("CLUSTER_ITER_SLEEP", "0")))

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None) -> None:  # noqa: D102
        print(f"iter {trainer.progress.iteration} rank {trainer.strategy.rank}", flush=True)

    def after_run(self, trainer) -> None:  # noqa: D102 - after the PreemptionHook's after_train decided
        if not trainer.preempted:
            state = {k: v.detach().cpu().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
            torch.save(
                {
                    "model": state,
                    "iteration": trainer.progress.iteration,
                    "world_size": trainer.strategy.world_size,
                    "torchrun": "TORCHELASTIC_RUN_ID" in os.environ,
                },
                trainer.run_dir.parent / f"result_rank{trainer.strategy.rank}.pt",
            )


model = dict(type="ClusterNet")
train_dataloader = dict(dataset=dict(type="ClusterBlobs"), batch_size=8, shuffle=True)
optim_wrapper = dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9))
param_scheduler = [dict(type="LinearLR", start_factor=0.2, by_epoch=False, begin=0, end=10)]
train_cfg = dict(by_epoch=True, max_epochs=2)
default_hooks = dict(checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=2), logger=dict(interval=4))
custom_hooks = [dict(type="ClusterReport")]
randomness = dict(seed=0)
resume = True
log_level = "WARNING"
