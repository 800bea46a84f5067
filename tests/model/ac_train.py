"""Runs of a tiny transformer with the Trainer, with and without activation checkpointing, under DDP / FSDP (torchrun)
or one process.

Usage: ac_train.py OUT_DIR RUN [RUN ...], each RUN ``name:strategy:ac`` (``ac`` 1 or 0).
Each run trains 3 iterations (SGD with momentum) and writes OUT_DIR/NAME/result_rank<r>.pt:
the full parameters (gathered on rank 0 under FSDP), the loss of every iteration, and how many
tensors autograd saved for backward in each iteration (``torch.autograd.graph.saved_tensors_hooks``).
FSDP shards every ``Block`` as its own unit, so ``fully_shard`` applies to the checkpointed blocks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw

#: The runs of the 2-process launch (test_activation_checkpointing.py).
SCRIPT_RUNS = ["ddp_plain:ddp:0", "ddp_ac:ddp:1", "fsdp_plain:fsdp:0", "fsdp_ac:fsdp:1"]


class Block(nn.Module):
    """A pre-norm residual MLP block (the unit that is checkpointed)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Net(tw.BaseModel):
    def __init__(self, dim: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(4, dim)
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(depth)])
        self.out = nn.Linear(dim, 1)

    def forward(self, x, y=None, mode="tensor"):
        pred = self.out(self.blocks(self.inp(x)))
        return {"loss": F.mse_loss(pred, y)} if mode == "loss" else pred


class SavedTensors(tw.Hook):
    """Counts the tensors autograd saves for backward during each training iteration (forward and backward)."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.losses: list[float] = []
        self._ctx: Any = None

    def before_train_iter(self, trainer, batch_idx, data_batch=None) -> None:
        self.counts.append(0)

        def pack(t: torch.Tensor) -> torch.Tensor:
            self.counts[-1] += 1
            return t

        self._ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._ctx.__enter__()

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None) -> None:
        self._ctx.__exit__(None, None, None)
        self.losses.append(outputs["loss"].item())


def data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, torch.sin(x.sum(1, keepdim=True)))


def run(out: Path, spec: str) -> None:
    name, strategy, ac = spec.split(":")
    rank = int(os.environ.get("RANK", 0))
    tw.seed_everything(0)
    counter = SavedTensors()
    trainer = tw.Trainer(
        model=Net(),
        work_dir=out / name,
        train_dataloader=dict(
            dataset=data(), batch_size=16 // max(1, int(os.environ.get("WORLD_SIZE", 1))), shuffle=False
        ),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=3),
        default_hooks=dict(checkpoint=None, logger=dict(interval=1)),
        strategy=dict(type="fsdp", shard_modules=["Block"]) if strategy == "fsdp" else strategy,
        activation_checkpointing=["Block"] if ac == "1" else None,
        custom_hooks=[counter],
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    trainer.train()
    full = trainer.strategy.full_model_state_dict()
    result = {
        "params": {k: v.detach().clone() for k, v in full.items()},
        "counts": counter.counts,
        "losses": counter.losses,
        "keys": sorted(trainer.unwrapped_model.state_dict()),
        "config": trainer.config["activation_checkpointing"],
    }
    trainer.close()
    (out / name).mkdir(parents=True, exist_ok=True)
    torch.save(result, out / name / f"result_rank{rank}.pt")


def main() -> None:
    out = Path(sys.argv[1])
    launched = "WORLD_SIZE" in os.environ
    if launched:
        dist.init_process_group("gloo")
    for spec in sys.argv[2:]:
        run(out, spec)
    if launched:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
