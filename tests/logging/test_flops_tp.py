"""tflops per device under tensor parallelism: 2 gloo processes as one (dp=1, tp=2) replica count each its half of
the split layers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from launch import gloo_group, use_gloo_env
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw

WORLD = 2
D_IN, HIDDEN, BATCH = 16, 64, 8


class Mlp(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(D_IN, HIDDEN), nn.Linear(HIDDEN, D_IN), nn.Linear(D_IN, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.head(F.relu(self.fc2(F.relu(self.fc1(x)))))
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    with gloo_group(rank, init_file, WORLD):
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(32, D_IN, generator=g), torch.randn(32, 1, generator=g))
        torch.manual_seed(0)
        t = tw.Trainer(
            model=Mlp(),
            work_dir=Path(out_dir) / f"rank{rank}",
            train_dataloader=DataLoader(data, batch_size=BATCH),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
            train_cfg=dict(by_epoch=False, max_iters=4),
            strategy=dict(type="fsdp", tensor_parallel=dict(size=2, plan={"fc1": "colwise", "fc2": "rowwise"})),
            default_hooks=dict(checkpoint=None, logger=dict(interval=2, flush_secs=0), flops=dict(peak_tflops=1.0)),
            log_level="WARNING",
            experiment_name="run",
        )
        t.train()
        flops = t.log_lines.flops
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"flops": flops.flops if flops else None}))
        t.close()
        del t


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tensor_parallel_ranks_count_their_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_gloo_env(monkeypatch, tmp_path)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    counts = [json.loads((tmp_path / f"rank{r}.json").read_text())["flops"] for r in range(WORLD)]
    # fc1 (its input needs no gradient: 4 FLOPs per weight and sample) and fc2 (6) are split over the 2 ranks; the head
    # is whole on each.
    split = (4 * D_IN * HIDDEN + 6 * HIDDEN * D_IN) * BATCH
    assert counts == [split // 2 + 6 * D_IN * BATCH] * 2
    records = [json.loads(line) for line in (tmp_path / "rank0" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records] == [2, 4]
    for r in records:  # per device: this rank's FLOPs, not the replica's; samples count the one data shard
        assert r["tflops"] == pytest.approx(counts[0] / r["time"] / 1e12, rel=1e-9)
        assert r["mfu"] == pytest.approx(r["tflops"], rel=1e-12)
        assert r["samples_per_s"] == pytest.approx(BATCH / r["time"], rel=1e-9)
