"""Train a small regression model with the Trainer; run under torchrun (DDP) or alone (reference).

Usage: ddp_train.py OUT_DIR BATCH_SIZE [--accum N] [--iters N] [--nan-rank R --nan-at K]
                    [--save-every N] [--resume] [--kill-rank R --kill-at K] [--signal-rank R --signal-at K]
Writes OUT_DIR/result_rank<r>.pt: the final parameters, the number of gradient all-reduces
DDP ran (one bucket here), the error the run ended with (if any), the exit status of a
preempted run and the iteration it stopped at. ``--kill-at`` SIGKILLs rank R before its
K-th step unless the run resumed (so a restarted run goes through); ``--signal-at`` sends
SIGTERM to rank R only, before its K-th step.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw


class Reg(tw.BaseModel):
    def __init__(self, nan_at: int | None) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.nan_at = nan_at
        self.calls = 0

    def forward(self, x, y=None, mode="tensor"):
        out = self.linear(x)
        if mode != "loss":
            return out
        loss = F.mse_loss(out, y)
        self.calls += 1
        if self.calls == self.nan_at:
            loss = loss * float("nan")
        return {"loss": loss}


class CountAllReduce(tw.Hook):
    """Counts DDP's gradient all-reduces through a communication hook (the real all-reduce still runs)."""

    def __init__(self) -> None:
        self.count = 0

    def before_train(self, trainer) -> None:
        model = trainer.model
        if hasattr(model, "register_comm_hook"):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def hook(state, bucket):
                self.count += 1
                return allreduce_hook(None, bucket)

            model.register_comm_hook(None, hook)


class SignalAt(tw.Hook):
    """Sends ``sig`` to this process before step ``at`` (SIGKILL only in a run that started from scratch)."""

    priority = "HIGHEST"

    def __init__(self, at: int, sig: int) -> None:
        self.at = at
        self.sig = sig
        self.start = 0

    def before_train(self, trainer) -> None:
        self.start = trainer.progress.iteration

    def before_train_iter(self, trainer, batch_idx, data_batch=None) -> None:
        if trainer.progress.iteration + 1 == self.at and not (self.sig == signal.SIGKILL and self.start > 0):
            os.kill(os.getpid(), self.sig)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("batch_size", type=int)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--nan-rank", type=int, default=-1)
    p.add_argument("--nan-at", type=int, default=0)
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N iterations (default: at the end)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--val-first", action="store_true", help="run trainer.val() before trainer.train()")
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--signal-rank", type=int, default=1)
    p.add_argument("--signal-at", type=int, default=0)
    a = p.parse_args()
    rank = int(os.environ.get("RANK", 0))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    ds = TensorDataset(x, x @ torch.randn(4, 1, generator=g) + 0.1 * torch.randn(64, 1, generator=g))
    tw.seed_everything(0)
    counter = CountAllReduce()
    hooks: list[tw.Hook] = [counter]
    if a.kill_at and rank == a.kill_rank:
        hooks.append(SignalAt(a.kill_at, signal.SIGKILL))
    if a.signal_at and rank == a.signal_rank:
        hooks.append(SignalAt(a.signal_at, signal.SIGTERM))
    trainer = tw.Trainer(
        model=Reg(a.nan_at if rank == a.nan_rank else None),
        work_dir=a.out,
        train_dataloader=dict(dataset=ds, batch_size=a.batch_size, shuffle=True),
        val_dataloader=dict(dataset=ds, batch_size=a.batch_size) if a.val_first else None,
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9), accumulative_counts=a.accum),
        train_cfg=dict(by_epoch=False, max_iters=a.iters),
        default_hooks=dict(
            logger=dict(interval=2, flush_secs=0), checkpoint=dict(by_epoch=False, interval=a.save_every or a.iters)
        ),
        resume=a.resume,
        custom_hooks=hooks,
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    error = None
    exit_code = None
    try:
        if a.val_first:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # no evaluator: the pass reports no metrics
                trainer.val()
        trainer.train()
    except FloatingPointError as e:
        error = f"FloatingPointError at iteration {trainer.progress.iteration}: {e}"
    except SystemExit as e:  # preempted: the checkpoint is written, the hook asks to exit with 128 + signal
        exit_code = e.code
    params = {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    torch.save(
        {
            "params": params,
            "allreduces": counter.count,
            "error": error,
            "world_size": trainer.strategy.world_size,
            "strategy": trainer.strategy.name,
            "exit_code": exit_code,
            "iteration": trainer.progress.iteration,
        },
        Path(a.out) / f"result_rank{rank}.pt",
    )
    trainer.close()
    if exit_code is not None:
        sys.exit(exit_code)


if __name__ == "__main__":
    main()
