"""A real 2-process gloo run: one rank's NaN raises on both ranks at the same agreement point, naming its iteration.

Lines every 2 iterations, agreement points every 4 (``trainer.agreement.every``), 5 iterations
per epoch: a NaN at iteration 6 raises on both ranks at the point of 8, a NaN at an epoch's last
iteration (5) at that epoch end's flush. Every line held until then reaches ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from launch import gloo_group, use_gloo_env
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw

WORLD = 2


class NaNAt(tw.BaseModel):
    def __init__(self, at: int | None) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.linear(x)
        if mode != "loss":
            return out
        self.calls += 1
        loss = torch.nn.functional.mse_loss(out, y)
        return {"loss": loss * float("nan") if self.calls == self.at else loss}


def _worker(rank: int, init_file: str, out_dir: str, nan_at: int) -> None:
    with gloo_group(rank, init_file, WORLD):
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g))
        # Rank 0 sees the NaN at iteration nan_at but its clock would hold lines for an hour; rank 1's writes each line.
        t = tw.Trainer(
            model=NaNAt(nan_at if rank == 0 else None),
            work_dir=Path(out_dir) / f"rank{rank}",
            train_dataloader=DataLoader(data, batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
            train_cfg=dict(by_epoch=True, max_epochs=2),
            strategy="ddp",
            default_hooks=dict(checkpoint=None, logger=dict(interval=2, flush_secs=3600.0 if rank == 0 else 0.0)),
            log_level="WARNING",
            experiment_name="run",
        )
        t.agreement.every = 4
        report: dict[str, Any] = {"writers": len(t.writers)}
        try:
            t.train()
        except FloatingPointError as e:
            report["error"] = str(e)
        report["iteration"] = t.progress.iteration
        t.close()
        del t  # the DDP wrapper must not outlive the process group
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("nan_at", "raised_at", "lines"), [(6, 8, [2, 4, 5, 7]), (5, 5, [2, 4, 5])])
def test_two_process_nan_raises_on_both_ranks_at_the_same_iteration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nan_at: int, raised_at: int, lines: list[int]
) -> None:
    use_gloo_env(monkeypatch, tmp_path)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path), nan_at), nprocs=WORLD, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    assert r0["iteration"] == r1["iteration"] == raised_at  # the same iteration on both
    assert (
        f"at iteration {nan_at} on rank 0: {{'loss': nan}}" in r0["error"]
        and f"at iteration {nan_at} on rank 0; " in r1["error"]
    )
    assert (r0["writers"], r1["writers"]) == (2, 0)
    records = [json.loads(line) for line in (tmp_path / "rank0" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records] == lines  # 40 samples over 2 ranks: 5 iterations per epoch
    # From the NaN's line on the loss is NaN (mean over the ranks; the writer stores it as a string): the
    # all-reduced gradients of that step were NaN on both ranks. The lines before it are finite.
    assert [math.isnan(float(r["loss"])) for r in records] == [r["iter"] >= nan_at for r in records]
    assert not (tmp_path / "rank1" / "run" / "metrics.jsonl").exists()
