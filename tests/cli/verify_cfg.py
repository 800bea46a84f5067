"""A small config for the verify-resume tests (tests/cli/test_verify_resume.py).

An MLP with dropout on shuffled Gaussian blobs, 12 batches per epoch, accumulation windows of 2,
clipping, momentum, a warm-up then a cosine schedule: everything an exact resume must carry.
Two resumes broken on purpose, switched on by ``--cfg-options``:

* ``custom_hooks=[dict(type="ReshuffleOnResume")]``: the dataset's order is permuted when a
  checkpoint is loaded (a dataset that reshuffles at resume);
* ``custom_hooks=[dict(type="UnsavedWarmup")]``: a loss weight that ramps with a counter the hook
  keeps and never saves (a hook with unsaved state).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import trainwright as tw
from trainwright.registry import DATASETS, HOOKS, MODELS


@MODELS.register()
class VerifyNet(tw.BaseModel):
    """8 -> 16 -> 4 MLP with dropout; ``loss_weight`` scales the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 4))
        self.loss_weight = 1.0

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor"):  # noqa: D102
        logits = self.net(x)
        if mode == "loss":
            return {"loss": self.loss_weight * F.cross_entropy(logits, y)}
        return logits


@DATASETS.register()
class VerifyBlobs(Dataset):
    """4 Gaussian blobs in 8-d (seeded); ``order`` maps an index to a sample."""

    def __init__(self, n: int = 48) -> None:
        g = torch.Generator().manual_seed(3)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.x = torch.randn(4, 8, generator=g)[self.y] * 2 + torch.randn(n, 8, generator=g)
        self.order = torch.arange(n)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = int(self.order[i])
        return self.x[j], self.y[j]


@HOOKS.register()
class ReshuffleOnResume(tw.Hook):
    """Broken on purpose: permutes the training data's order when a checkpoint is loaded."""

    def after_load_checkpoint(self, trainer, checkpoint) -> None:  # noqa: D102
        dataset = trainer.train_loop.dataloader.dataset
        dataset.order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(11))


@HOOKS.register()
class UnsavedWarmup(tw.Hook):
    """Broken on purpose: ramps the model's loss weight with a step counter it never saves."""

    def __init__(self) -> None:
        self.count = 0

    def before_train_iter(self, trainer, batch_idx, data_batch=None) -> None:  # noqa: D102
        self.count += 1
        trainer.unwrapped_model.loss_weight = min(1.0, 0.5 + self.count / 20)


model = dict(type="VerifyNet")
train_dataloader = dict(dataset=dict(type="VerifyBlobs"), batch_size=4, shuffle=True)
optim_wrapper = dict(
    optimizer=dict(type="SGD", lr=0.1, momentum=0.9), accumulative_counts=2, clip_grad=dict(max_norm=1.0)
)
param_scheduler = [
    dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=6),
    dict(type="CosineAnnealingLR", by_epoch=True, begin=0, end=3),
]
train_cfg = dict(by_epoch=True, max_epochs=3)
default_hooks = dict(checkpoint=dict(interval=1), logger=dict(interval=4))
randomness = dict(seed=1)
log_level = "WARNING"
