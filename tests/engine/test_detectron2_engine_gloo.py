"""detectron2's SimpleTrainer on 2 gloo processes: metrics reduced over ranks (data_time max, losses mean), a NaN on
one rank raises on both."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from launch import gloo_group, use_gloo_env
from torch import nn
from torch.nn.parallel import DistributedDataParallel

WORLD = 2
STEPS = 3


class Recording(nn.Module):
    """Returns two losses and keeps this rank's own values, for the test to reduce by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 1)
        self.local: list[float] = []

    def forward(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.lin(batch)
        losses = {"loss_a": out.pow(2).mean(), "loss_b": out.abs().mean()}
        self.local.append(sum(v.item() for v in losses.values()))
        return losses


class Batches:
    """This rank's batches; rank 1 waits 50 ms for each (data_time is the slower rank's)."""

    def __init__(self, rank: int, nan_at: int | None = None) -> None:
        self.rank, self.nan_at = rank, nan_at

    def __iter__(self) -> Iterator[torch.Tensor]:
        g = torch.Generator().manual_seed(10 + self.rank)
        for i in range(STEPS):
            if self.rank == 1:
                time.sleep(0.05)
            x = torch.randn(4, 3, generator=g)
            yield x * float("nan") if i == self.nan_at else x


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    from trainwright.engine import SimpleTrainer

    with gloo_group(rank, init_file, WORLD):
        torch.manual_seed(0)
        inner = Recording()
        model = DistributedDataParallel(inner)
        trainer = SimpleTrainer(model, Batches(rank), torch.optim.SGD(model.parameters(), lr=0.1))
        trainer.train(0, STEPS)
        report: dict[str, Any] = {
            "local": list(inner.local),
            **{k: trainer.storage.history(k).values() for k in ("total_loss", "loss_a", "data_time", "rank_data_time")},
        }

        trainer = SimpleTrainer(
            model, Batches(rank, nan_at=1 if rank == 1 else None), torch.optim.SGD(model.parameters(), lr=0.1)
        )
        try:
            trainer.train(0, STEPS)
        except FloatingPointError as e:
            report["error"] = str(e)
        del model, trainer  # the DDP wrapper must not outlive the process group
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_metrics_are_reduced_over_ranks_and_a_nan_on_one_rank_raises_on_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_gloo_env(monkeypatch, tmp_path)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    for key in ("total_loss", "loss_a", "data_time"):
        assert r0[key] == r1[key]  # every rank holds the same reduced numbers
    totals = [v for v, _ in r0["total_loss"]]
    assert totals == pytest.approx([(a + b) / 2 for a, b in zip(r0["local"], r1["local"])], rel=1e-6)
    assert [it for _, it in r0["total_loss"]] == list(range(STEPS))
    for (dt, _), (mine, _) in zip(r0["data_time"], r0["rank_data_time"]):
        assert dt >= 0.05 > mine  # the maximum: rank 1's wait, not rank 0's
    for r in (r0, r1):
        assert "Loss became infinite or NaN at iteration=1!" in r["error"]
