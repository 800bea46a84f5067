"""find_lr under 2 DDP processes (torchrun, gloo): the worker of tests/tuning/test_lr_finder_gloo.py.

Usage: lr_rank_train.py OUT_DIR [STRATEGY ...]
For each STRATEGY (``ddp``, ``fsdp``; default ``ddp``) each rank trains twice in this process:
once after find_lr, once without; it writes both final full weights and the finder's curve to
OUT_DIR/STRATEGY/rank<r>.pt. The runs share one process group (the first Trainer joins it).
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


class Net(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

    def forward(self, x, y=None, mode="tensor"):
        out = self.net(x)
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 4, generator=g)
    return TensorDataset(x, x @ torch.randn(4, 1, generator=g) + 0.1 * torch.randn(64, 1, generator=g))


def run(work_dir: Path, strategy: str, tune: bool) -> tuple[dict[str, torch.Tensor], dict]:
    t = tw.Trainer(
        model=Net(),
        work_dir=work_dir,
        experiment_name="run",
        strategy=strategy,
        train_dataloader=dict(dataset=data(), batch_size=4, shuffle=True),  # 8 batches per rank and epoch
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        param_scheduler=dict(type="LinearLR", start_factor=0.2, by_epoch=False, begin=0, end=6),
        default_hooks=dict(checkpoint=None),
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    with t:
        curve = {}
        if tune:
            r = t.find_lr(
                min_lr=1e-4, max_lr=10.0, num_steps=12
            )  # more updates than an epoch: the loader starts a second pass
            curve = {"lrs": r.lrs, "losses": r.losses, "suggestion": r.suggestion}
        t.train()
        full = t.strategy.full_model_state_dict()  # gathered under FSDP (rank 0): a collective on every rank
        return {k: v.detach().clone() for k, v in full.items()}, curve


def main() -> None:
    out = Path(sys.argv[1])
    for strategy in sys.argv[2:] or ["ddp"]:
        (out / strategy).mkdir(parents=True, exist_ok=True)
        tuned, curve = run(out / strategy / "tuned", strategy, True)
        plain, _ = run(out / strategy / "plain", strategy, False)
        torch.save({"tuned": tuned, "plain": plain, **curve}, out / strategy / f"rank{RANK}.pt")


if __name__ == "__main__":
    main()
