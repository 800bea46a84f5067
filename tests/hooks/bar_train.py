"""A short training run for the progress-bar tests: ``python bar_train.py WORK_DIR [ENABLE]``.

Each forward sleeps 2 ms so the bar is redrawn several times; prints ``RUN_DIR <path>`` at the end.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import trainwright as tw


class Slow(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, y=None, mode="tensor"):
        time.sleep(0.002)
        out = self.linear(x)
        return {"loss": F.cross_entropy(out, y)} if mode == "loss" else out


def main() -> None:
    work_dir = sys.argv[1]
    enable = {"auto": "auto", "true": True, "false": False}[sys.argv[2] if len(sys.argv) > 2 else "auto"]
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(240, 4, generator=g), torch.randint(0, 3, (240,), generator=g))
    trainer = tw.Trainer(
        Slow(),
        work_dir=work_dir,
        train_dataloader=dict(dataset=data, batch_size=4),
        val_dataloader=dict(dataset=data, batch_size=8),
        val_evaluator=tw.evaluation.Accuracy(),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        default_hooks=dict(
            checkpoint=None, logger=dict(interval=20), progress_bar=dict(enable=enable, refresh_per_second=20)
        ),
        randomness=dict(seed=0),
    )
    trainer.train()
    print("print() from user code")
    trainer.close()
    print(f"RUN_DIR {trainer.run_dir}")


if __name__ == "__main__":
    main()
