"""A real 2-process gloo run whose ranks see different losses: rank 0's ``metrics.jsonl`` logs their mean.

Rank r's loss is its own batch's mean squared error plus ``3 * r``, so the mean differs from either
rank's own loss and from their sum. Lines at every iteration.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from conftest import LinearReg, RecordLosses, regression_set, train_records
from launch import gloo_group, use_gloo_env
from torch.utils.data import DataLoader

import trainwright as tw

WORLD = 2
ITERS = 6


class Offset(LinearReg):
    """The linear regression with ``offset`` added to its loss (each rank its own)."""

    def __init__(self, offset: float) -> None:
        super().__init__()
        self.offset = offset

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.linear(x)
        return {"loss": F.mse_loss(out, y) + self.offset} if mode == "loss" else out


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    with gloo_group(rank, init_file, WORLD):
        losses = RecordLosses()
        trainer = tw.Trainer(
            model=Offset(3.0 * rank),
            work_dir=Path(out_dir) / f"rank{rank}",
            train_dataloader=DataLoader(regression_set(48), batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
            train_cfg=dict(by_epoch=False, max_iters=ITERS),
            strategy="ddp",
            default_hooks=dict(checkpoint=None, logger=dict(interval=1, flush_secs=0)),
            custom_hooks=[losses],
            log_level="WARNING",
            experiment_name="run",
        )
        trainer.train()
        trainer.close()
        trainer = None  # the DDP wrapper must not outlive the process group
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(losses.losses))


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_with_different_losses_log_their_mean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_gloo_env(monkeypatch, tmp_path)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    own = [{int(k): v for k, v in json.loads((tmp_path / f"rank{r}.json").read_text()).items()} for r in range(WORLD)]
    records = train_records(tmp_path / "rank0" / "run")
    assert [r["iter"] for r in records] == list(range(1, ITERS + 1))
    for r in records:
        it = r["iter"]
        assert abs(own[1][it] - own[0][it]) > 0.1  # the ranks' losses differ (their batches, the offset)
        assert r["loss"] == pytest.approx((own[0][it] + own[1][it]) / 2, rel=1e-9), it  # their mean, not rank 0's
    assert not (tmp_path / "rank1" / "run" / "metrics.jsonl").exists()  # only rank 0 writes
