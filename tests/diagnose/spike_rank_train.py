"""A loss spike on rank 1 only of a 2-process run (torchrun, gloo): the worker of
tests/diagnose/test_spike_guard_gloo.py.

Usage: spike_rank_train.py OUT_DIR RUN [RUN ...]
Each RUN is ``name:strategy:action[:capture=N][:save=N]`` (strategy ``ddp`` or ``fsdp``;
action ``skip`` or ``rollback``; ``capture=N``: spike_guard capture_every=N; ``save=N``: a
CheckpointHook saving every N iterations, which a rollback without ``capture`` goes back to;
``async=1``: those saves written in the background; ``accum=N``: accumulative_counts=N; ``ema=1``: an EMAHook, its
gathered average written too).
The runs share one process group, made by the first Trainer (later ones join it).
64 samples, batch 4 per rank, shuffle=False: rank r's batch b holds samples 8b + 2j + r. The
targets of rank 1's batch 5 (iteration 6 of each epoch) are 1e4. Each rank writes the run's
final full weights and its guard's counters to OUT_DIR/NAME/rank<r>.pt.
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


class Reg(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)

    def forward(self, x, y=None, mode="tensor"):
        out = self.linear(x)
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.randn(4, 1, generator=g) + 0.1 * torch.randn(64, 1, generator=g)
    y[[8 * 5 + 2 * j + 1 for j in range(4)]] = 1e4  # rank 1's batch 5
    return TensorDataset(x, y)


def run(out: Path, spec: str) -> None:
    name, strategy, action, *opts = spec.split(":")
    o = {k: int(v) for k, v in (kv.split("=", 1) for kv in opts)}
    save = o.get("save", 0)
    t = tw.Trainer(
        model=Reg(),
        work_dir=out / name / "work",
        experiment_name="run",
        strategy=strategy,
        train_dataloader=dict(dataset=data(), batch_size=4, shuffle=False),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.02, momentum=0.9), accumulative_counts=o.get("accum", 1)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        default_hooks=dict(
            logger=dict(interval=4),
            checkpoint=dict(by_epoch=False, interval=save, async_save=bool(o.get("async"))) if save else None,
        ),
        randomness=dict(seed=0),
        log_level="WARNING",
        spike_guard=dict(window=4, threshold=6.0, action=action, min_history=4, capture_every=o.get("capture")),
        custom_hooks=[tw.hooks.EMAHook(momentum=0.1)] if o.get("ema") else [],
    )
    with t:
        t.train()
        g = t.spike_guard
        full = t.strategy.full_model_state_dict()  # gathered under FSDP: a collective on every rank
        ema = [h for h in t.hooks if isinstance(h, tw.hooks.EMAHook)]
        averaged = (
            ema[0].state_dict()["averaged"] if ema else {}
        )  # DTensors under FSDP: whole ones below (a collective on every rank)
        averaged = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in averaged.items()}
        result = {
            "params": {k: v.detach().clone() for k, v in full.items()},
            "skipped": g.skipped,
            "rollbacks": g.rollbacks,
            "iteration": t.progress.iteration,
            "ema": {k: v.detach().cpu().clone() for k, v in averaged.items()},
        }
    torch.save(result, out / name / f"rank{RANK}.pt")


def main() -> None:
    out = Path(sys.argv[1])
    for spec in sys.argv[2:]:
        (out / spec.split(":")[0]).mkdir(parents=True, exist_ok=True)
        run(out, spec)


if __name__ == "__main__":
    main()
