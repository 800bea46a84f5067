"""A real 2-process gloo run of 600 iterations: collectives at the agreement cadence only, and every line exact.

Lines every 10 iterations; the logger's clock never says "write" (lines go out by the
``flush_every`` rule only, so they are held longest). The collectives are counted by a DDP
strategy subclass: one per agreement point (``trainer.agreement.every``), none elsewhere, and
rank 0's ``metrics.jsonl`` holds every logging iteration's mean loss over both ranks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from conftest import LinearReg, RecordLosses, regression_set, train_records
from launch import gloo_group, use_gloo_env
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.strategies.ddp import DDPStrategy

WORLD = 2
ITERS = 600


class CountingDDP(DDPStrategy):
    """DDP whose agreement collectives are counted by iteration."""

    def __init__(self) -> None:
        super().__init__()
        self.trainer: Any = None
        self.gathered_at: list[int] = []

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self.gathered_at.append(self.trainer.progress.iteration)
        return super().all_gather(tensor)


def _worker(rank: int, init_file: str, out_dir: str, every: int) -> None:
    with gloo_group(rank, init_file, WORLD):
        losses = RecordLosses()
        strategy = CountingDDP()
        trainer = tw.Trainer(
            model=LinearReg(),
            work_dir=Path(out_dir) / f"rank{rank}",
            train_dataloader=DataLoader(regression_set(400), batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
            train_cfg=dict(by_epoch=False, max_iters=ITERS),
            strategy=strategy,
            default_hooks=dict(checkpoint=None, logger=dict(interval=10, flush_secs=3600.0)),
            custom_hooks=[losses],
            log_level="WARNING",
            experiment_name="run",
        )
        strategy.trainer = trainer
        trainer.agreement.every = every
        trainer.metric_store.flush_every = 100
        trainer.train()
        report = {"iteration": trainer.progress.iteration, "gathered_at": strategy.gathered_at, "losses": losses.losses}
        trainer.close()
        trainer = strategy = None  # the DDP wrapper must not outlive the process group
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("every", [10, 50])
def test_two_process_run_agrees_at_the_cadence_and_logs_every_line_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int
) -> None:
    use_gloo_env(monkeypatch, tmp_path)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path), every), nprocs=WORLD, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    assert r0["iteration"] == r1["iteration"] == ITERS
    # the collectives, counted on each rank: one per agreement point, and one more at the first (the count of its
    # numbers is agreed there)
    assert r0["gathered_at"] == r1["gathered_at"] == [every, *range(every, ITERS + 1, every)]
    records = train_records(tmp_path / "rank0" / "run")
    assert [r["iter"] for r in records] == list(range(10, ITERS + 1, 10))
    own = [{int(k): v for k, v in r["losses"].items()} for r in (r0, r1)]  # each rank's own losses
    for r in records:  # the mean over the line's 10 iterations of the mean over the ranks
        it = r["iter"]
        expected = sum((own[0][i] + own[1][i]) / 2 for i in range(it - 9, it + 1)) / 10
        assert r["loss"] == pytest.approx(expected, rel=1e-9), it
    assert not (tmp_path / "rank1" / "run" / "metrics.jsonl").exists()
