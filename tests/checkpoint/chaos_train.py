"""A small training run for the chaos / preemption tests, driven as a subprocess.

It has everything that makes exact resume hard: dropout, shuffled data with a random
augmentation drawn per sample (in the main process or in 2 workers), gradient
accumulation with windows that straddle checkpoints and a short last window per epoch,
gradient clipping, SGD momentum, an iteration-based warm-up then an epoch-based cosine
schedule, validation every epoch (best-k checkpoints) and checkpoints every few
iterations. It always starts with ``resume=True``.

Output: one ``start <iteration>`` line when training starts, ``iter <n>`` after every
iteration (flushed, so the parent can time its kills), and at the end ``result.pt`` in
the work dir with the final model and optimizer states.

Fault injection (environment):
    CHAOS_KILL_ON_REPLACE="<suffix>:<k>": SIGKILL this process at the k-th atomic rename
        onto a file whose name ends with ``<suffix>`` (``.pth``: the checkpoint is fully in
        its temporary file but not renamed; ``latest``: the checkpoint is complete but the
        pointer still names the previous one).
    CHAOS_ITER_SLEEP: seconds to sleep inside each training step (spreads out kill times).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import trainwright as tw
import trainwright.checkpoint.io as ckpt_io
from trainwright.hooks.hook import Hook
from trainwright.utils.seed import set_random_seed


class NoisyBlobs(Dataset):
    """4 Gaussian blobs in 16-d; every read adds fresh noise (a random augmentation)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 4, (n,), generator=g)
        centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(123)) * 2
        self.x = centers[self.y] + torch.randn(n, 16, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.1 * torch.randn(16), self.y[i]


class Net(tw.BaseModel):
    """16 → 32 → 4 MLP with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor"):  # noqa: D102
        logits = self.net(x)
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, y)}
        return logits


class Report(Hook):
    """Prints progress lines for the parent process; optionally slows each step."""

    priority = "HIGHEST"

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep

    def before_train(self, trainer: tw.Trainer) -> None:  # noqa: D102
        print(f"start {trainer.progress.iteration}", flush=True)

    def before_train_iter(self, trainer: tw.Trainer, batch_idx: int, data_batch=None) -> None:  # noqa: D102
        if self.sleep:
            time.sleep(self.sleep)

    def after_train_iter(self, trainer: tw.Trainer, batch_idx: int, data_batch=None, outputs=None) -> None:  # noqa: D102
        print(f"iter {trainer.progress.iteration}", flush=True)


def install_replace_killer(spec: str) -> None:
    """SIGKILL ourselves at the k-th ``os.replace`` onto a name ending with the suffix."""
    suffix, k = spec.split(":")
    count = {"n": 0}
    real_os = os

    class _Os:
        def __getattr__(self, name: str):
            return getattr(real_os, name)

        @staticmethod
        def replace(src, dst):  # noqa: ANN001, ANN205
            if str(dst).endswith(suffix):
                count["n"] += 1
                if count["n"] == int(k):
                    print(f"killing myself before renaming onto {dst}", flush=True)
                    real_os.kill(real_os.getpid(), signal.SIGKILL)
            return real_os.replace(src, dst)

    ckpt_io.os = _Os()  # type: ignore[assignment]


def build(
    work_dir: str,
    workers: int = 0,
    epochs: int = 3,
    async_save: bool = False,
    experiment: str = "run",
    sleep: float = 0.0,
    hooks: list[Hook] | None = None,
    checkpoint: dict | None = None,
    **overrides,
) -> tw.Trainer:
    """The trainer of the chaos runs (the in-process resume tests reuse it with ``overrides``)."""
    set_random_seed(7)  # the model is built before the Trainer seeds: seed its initialisation too
    ckpt_cfg = dict(
        interval=4, by_epoch=False, max_keep_ckpts=2, save_best="val/acc", max_keep_best=2, async_save=async_save
    )
    ckpt_cfg.update(checkpoint or {})
    kwargs = dict(
        model=Net(),
        work_dir=work_dir,
        experiment_name=experiment,
        train_dataloader=DataLoader(NoisyBlobs(150, 0), batch_size=10, shuffle=True, num_workers=workers),
        val_dataloader=DataLoader(NoisyBlobs(40, 1), batch_size=20),
        val_evaluator=tw.evaluation.Accuracy(),
        optim_wrapper=dict(
            optimizer=dict(type="SGD", lr=0.2, momentum=0.9), accumulative_counts=2, clip_grad=dict(max_norm=1.0)
        ),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=20),
            dict(type="CosineAnnealingLR", by_epoch=True, begin=0, end=epochs),
        ],
        train_cfg=dict(by_epoch=True, max_epochs=epochs, val_interval=1),
        default_hooks=dict(logger=dict(interval=2), checkpoint=ckpt_cfg),
        custom_hooks=[Report(sleep), *(hooks or [])],
        randomness=dict(seed=7),
        resume=True,
        log_level="WARNING",
    )
    kwargs.update(overrides)
    return tw.Trainer(**kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--async-save", action="store_true")
    parser.add_argument("--experiment", default="run")
    args = parser.parse_args()
    if os.environ.get("CHAOS_KILL_ON_REPLACE"):
        install_replace_killer(os.environ["CHAOS_KILL_ON_REPLACE"])
    sleep = float(os.environ.get("CHAOS_ITER_SLEEP", "0"))
    trainer = build(args.work_dir, args.workers, args.epochs, args.async_save, args.experiment, sleep)
    trainer.train()
    ow = trainer.optim_wrapper
    torch.save(
        {"model": trainer.unwrapped_model.state_dict(), "optimizer": ow.optimizer.state_dict()},
        Path(args.work_dir) / "result.pt",
    )
    print("done", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
