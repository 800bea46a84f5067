"""A real 2-process gloo run of 600 iterations: the metric store agrees at its cadence, and every line is still exact.

With ``agree_secs`` of an hour and ``flush_every=100`` the logging iterations (every 10) make
collectives only at the first two calls (no pace known yet) and then once per 100
iterations (the cap), where the store's own flush of 100 rows also makes one; the end of
training settles the rest. ``agree_secs=0`` is the agreement at every logging iteration.
Either way rank 0's ``metrics.jsonl`` holds every logging iteration's mean loss over both
ranks (the logger's clock never says "write": lines go out by the flush_every rule only,
so they are held longest).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

import trainwright as tw
from conftest import LinearReg, RecordLosses, regression_set, train_records
from launch import use_gloo_env
from trainwright.strategies.ddp import DDPStrategy

WORLD = 2
ITERS = 600


def _worker(rank: int, init_file: str, out_dir: str, agree_secs: float) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    gathered_at: list[int] = []
    start = DDPStrategy.all_gather_async
    trainer: Any = None

    def counted(self: DDPStrategy, tensor: torch.Tensor) -> Any:
        gathered_at.append(trainer.progress.iteration)
        return start(self, tensor)

    DDPStrategy.all_gather_async = counted  # type: ignore[method-assign]
    try:
        losses = RecordLosses()
        trainer = tw.Trainer(
            model=LinearReg(), work_dir=Path(out_dir) / f"rank{rank}", train_dataloader=DataLoader(regression_set(400), batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)), train_cfg=dict(by_epoch=False, max_iters=ITERS), strategy="ddp",
            default_hooks=dict(checkpoint=None, logger=dict(interval=10, flush_secs=3600.0)), custom_hooks=[losses],
            log_level="WARNING", experiment_name="run",
        )
        trainer.metric_store.agree_secs = agree_secs
        trainer.metric_store.flush_every = 100
        trainer.train()
        report = {"iteration": trainer.progress.iteration, "gathered_at": gathered_at, "losses": losses.losses}
        trainer.close()
        trainer = None  # the DDP wrapper must not outlive the process group
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        DDPStrategy.all_gather_async = start  # type: ignore[method-assign]
        gc.collect()
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


# 3600 s: 10 and 20 agree (the answer of 10 brings the first pace: gap = the cap, 100, next point 120); the
# store's own flush at 100 (the loop's, every flush_every-th iteration) agrees on everything a point does, so the
# next point is 200, where the agreement takes the rows and the flush after it has none to exchange; and so on.
CADENCE = [10, 20, *range(100, ITERS + 1, 100)]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("agree_secs", "gathered_at"), [(3600.0, CADENCE), (0.0, list(range(10, ITERS + 1, 10)))])
def test_two_process_run_agrees_at_the_cadence_and_logs_every_line_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agree_secs: float, gathered_at: list[int]
) -> None:
    use_gloo_env(monkeypatch, tmp_path)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path), agree_secs), nprocs=WORLD, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    assert r0["iteration"] == r1["iteration"] == ITERS
    assert r0["gathered_at"] == r1["gathered_at"] == gathered_at  # the collectives, counted on each rank
    records = train_records(tmp_path / "rank0" / "run")
    assert [r["iter"] for r in records] == list(range(10, ITERS + 1, 10))
    own = [{int(k): v for k, v in r["losses"].items()} for r in (r0, r1)]  # each rank's own losses
    for r in records:  # the mean over the line's 10 iterations of the mean over the ranks
        it = r["iter"]
        expected = sum((own[0][i] + own[1][i]) / 2 for i in range(it - 9, it + 1)) / 10
        assert r["loss"] == pytest.approx(expected, rel=1e-9), it
    assert not (tmp_path / "rank1" / "run" / "metrics.jsonl").exists()
