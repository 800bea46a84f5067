"""Worker of tests/strategies/test_sync_batchnorm.py: DDP with mmengine's ``sync_bn='torch'`` (``sync_batchnorm=True``).

Usage: syncbn_train.py OUT_DIR DEVICE. On ``cpu`` (any number of processes): prints the start
error on each rank. On ``cuda`` (one process): trains the same BatchNorm model with the DDP
strategy converting it and with the single strategy and saves both runs' weights and the
converted model's layer types to OUT_DIR/one.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import trainwright as tw

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from conftest import BNReg  # noqa: E402

RANK = int(os.environ.get("RANK", 0))


def run(out: Path, strategy: dict, **kwargs) -> tw.Trainer:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    trainer = tw.Trainer.from_config(
        dict(
            model=BNReg(),
            work_dir=str(out / "work"),
            train_dataloader=dict(dataset=TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=False),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05)),
            train_cfg=dict(by_epoch=True, max_epochs=2),
            strategy=strategy,
            default_hooks=dict(checkpoint=None),
            randomness=dict(seed=0),
            log_level="WARNING",
            **kwargs,
        )
    )
    trainer.train()
    return trainer


def main() -> None:
    out, device = Path(sys.argv[1]), sys.argv[2]
    if device == "cpu":
        try:
            run(out, dict(type="ddp", device="cpu"), sync_bn="torch")
        except ValueError as e:
            print(f"rank {RANK}: {e}", flush=True)
        return
    synced = run(out, dict(type="ddp", device=device), sync_bn="torch")  # mmengine's spelling reaches the DDP strategy
    plain = run(out, dict(type="single", device=device))
    torch.save(
        dict(
            types=[type(m).__name__ for m in synced.unwrapped_model.modules()],
            synced={k: v.cpu() for k, v in synced.unwrapped_model.state_dict().items()},
            plain={k: v.cpu() for k, v in plain.unwrapped_model.state_dict().items()},
        ),
        out / "one.pt",
    )
    synced.close()
    plain.close()


if __name__ == "__main__":
    main()
