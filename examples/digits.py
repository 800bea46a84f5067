"""A config: a small MLP on scikit-learn's 8x8 digits (real data shipped with scikit-learn).

Run:   trainwright train examples/digits.py [--work-dir work_dirs/digits] [--cfg-options train_cfg.max_epochs=5]
Then:  trainwright test examples/digits.py --checkpoint work_dirs/digits/checkpoints/epoch_10.pth
       trainwright plot work_dirs/digits --keys loss val/acc lr --out digits.png

Reaches >= 95% validation accuracy in a few seconds on 2 CPU cores; writes the log,
metrics.jsonl, the resolved config and checkpoints under the work dir. The classes below
are registered when the config is loaded; the module-level variables are the config.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw
from trainwright.registry import DATASETS, MODELS


@MODELS.register()
class DigitsNet(tw.BaseModel):
    """A 64 -> hidden -> 10 MLP with dropout."""

    def __init__(self, hidden: int = 128, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor"):
        logits = self.net(x)
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, y)}
        return logits


@DATASETS.register()
class DigitsDataset(TensorDataset):
    """scikit-learn's digits, pixels scaled to [0, 1], split into ``"train"`` / ``"val"`` by a seeded permutation."""

    def __init__(self, split: str = "train", val_fraction: float = 0.2, seed: int = 0) -> None:
        from sklearn.datasets import load_digits

        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x, dtype=torch.float32) / 16.0
        y = torch.tensor(y, dtype=torch.long)
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
        n_val = int(len(x) * val_fraction)
        idx = perm[:n_val] if split == "val" else perm[n_val:]
        super().__init__(x[idx], y[idx])


work_dir = "work_dirs/digits"
model = dict(type="DigitsNet", hidden=128)
train_dataloader = dict(dataset=dict(type="DigitsDataset", split="train"), batch_size=32, shuffle=True)
val_dataloader = dict(dataset=dict(type="DigitsDataset", split="val"), batch_size=256)
val_evaluator = dict(type="Accuracy")
test_dataloader = val_dataloader
test_evaluator = val_evaluator
optim_wrapper = dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9), clip_grad=dict(max_norm=1.0))
param_scheduler = [
    dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=50),
    dict(type="CosineAnnealingLR", by_epoch=True, begin=0, end=10),
]
train_cfg = dict(by_epoch=True, max_epochs=10, val_interval=1)
default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=3, save_best="val/acc"))
randomness = dict(seed=0)
precision = "32"
