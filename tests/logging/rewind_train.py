"""A small training run for the log-rewind test, driven as a subprocess: ``python rewind_train.py WORK_DIR``.

Iteration-based, 20 iterations of a linear regression over shuffled data, a log line at every
iteration written at once (``interval=1, flush_secs=0``), ``metrics.jsonl``, CSV and
TensorBoard, a checkpoint every 5 iterations, always ``resume=True``. Prints ``iter <n>``
(flushed) after each iteration's log line, so the parent can time its ``kill -9``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw

ITERS = 20


class Reg(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.linear = nn.Linear(4, 1)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(1, 4, generator=g))
            self.linear.bias.zero_()

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.linear(x)
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


class Report(tw.Hook):
    """``iter <n>`` on stdout after the logger wrote the line of iteration n; a short pause spreads the kills."""

    priority = "LOWEST"

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        print(f"iter {trainer.progress.iteration}", flush=True)
        time.sleep(0.05)


def main(work_dir: str) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=g)
    data = TensorDataset(x, x @ torch.randn(4, 1, generator=g))
    t = tw.Trainer(
        model=Reg(),
        work_dir=work_dir,
        train_dataloader=DataLoader(data, batch_size=4, shuffle=True),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=ITERS),
        default_hooks=dict(checkpoint=dict(interval=5, by_epoch=False), logger=dict(interval=1, flush_secs=0)),
        custom_hooks=[Report()],
        randomness=dict(seed=3),
        writers=["console", dict(type="jsonl", flush_secs=0), "csv", dict(type="tensorboard", flush_secs=0.5)],
        log_level="WARNING",
        resume=True,
    )
    t.train()
    t.close()


if __name__ == "__main__":
    main(sys.argv[1])
