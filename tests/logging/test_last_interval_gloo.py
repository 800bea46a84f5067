"""A real 2-process gloo run: the last, short interval is flushed at the same point on both ranks and logged once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from conftest import LinearReg
from launch import gloo_group, use_gloo_env
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw

WORLD = 2


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    with gloo_group(rank, init_file, WORLD):
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g))
        # Rank 0's clock would hold lines for an hour, rank 1's writes each: the flushes are still agreed.
        t = tw.Trainer(
            model=LinearReg(),
            work_dir=Path(out_dir) / f"rank{rank}",
            train_dataloader=DataLoader(data, batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
            train_cfg=dict(by_epoch=False, max_iters=7),
            strategy="ddp",
            default_hooks=dict(checkpoint=None, logger=dict(interval=3, flush_secs=3600.0 if rank == 0 else 0.0)),
            log_level="WARNING",
            experiment_name="run",
        )
        t.train()
        report: dict[str, Any] = {"iteration": t.progress.iteration}
        t.close()
        del t  # the DDP wrapper must not outlive the process group
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_process_iteration_run_logs_its_last_short_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_gloo_env(monkeypatch, tmp_path)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    assert r0["iteration"] == r1["iteration"] == 7
    records = [json.loads(line) for line in (tmp_path / "rank0" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records] == [3, 6, 7]
    for r in records:  # 4 samples per process and iteration, 2 processes
        assert r["samples_per_s"] == pytest.approx(8 / r["time"], rel=1e-9)
    assert not (tmp_path / "rank1" / "run" / "metrics.jsonl").exists()
