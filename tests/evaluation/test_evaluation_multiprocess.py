"""A real 2-process gloo run: sharded, padded validation gives the single-process numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed
import torch.multiprocessing as mp
from sklearn.metrics import accuracy_score
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trainwright import dist
from trainwright.evaluation import Accuracy, Evaluator, Metric

WORLD = 2
N, C = 23, 4  # odd: DistributedSampler pads rank 1 with one duplicate sample


def make_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return torch.arange(N), torch.randn(N, C, generator=g), torch.randint(0, C, (N,), generator=g)


class SampleOrder(Metric):
    """Per-sample layout: records which dataset index each result belongs to."""

    seen: list[int] = []

    def process(self, data_batch: Any, outputs: Any) -> None:
        self.results.extend(data_batch[0])

    def compute(self, results: list[Any]) -> dict[str, float]:
        SampleOrder.seen = [int(i) for i in results]
        return {"count": len(results)}


def _evaluate_shards(rank: int, shuffle: bool) -> dict[str, Any]:
    idx, scores, target = make_data()
    dataset = TensorDataset(idx, scores, target)
    sampler = DistributedSampler(dataset, num_replicas=WORLD, rank=rank, shuffle=shuffle, seed=5)
    loader = DataLoader(dataset, batch_size=5, sampler=sampler)
    evaluator = Evaluator([dict(type="Accuracy", topk=(1, 2)), SampleOrder()])
    local = 0
    for batch in loader:
        evaluator.process(batch, batch[1])
        local += len(batch[0])
    report: dict[str, Any] = {
        "local_samples": local,
        "metrics": evaluator.evaluate(len(dataset)),
        "order": SampleOrder.seen,
    }
    # evaluated with a size too large to cut anything: shows the padding would change the answer
    acc = Accuracy(topk=(1, 2))
    for batch in loader:
        acc.process(batch, batch[1])
    report["padded"] = acc.evaluate(10**6)
    return report


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        report: dict[str, Any] = {
            "is_distributed": dist.is_distributed(),
            "dist_info": list(dist.get_dist_info()),
            "is_main": dist.is_main_process(),
        }
        ops = {}
        for op in ("sum", "mean", "max", "min"):
            t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
            assert dist.all_reduce(t, op=op) is t  # in place
            ops[op] = t.tolist()
        report["all_reduce"] = ops
        report["broadcast"] = dist.broadcast_object({"from": rank}, src=1)
        report["all_gather"] = dist.all_gather_object(("rank", rank))
        report["master_only"] = dist.master_only(lambda: "ran")()
        dist.barrier()
        report["sequential"] = _evaluate_shards(rank, shuffle=False)
        report["shuffled"] = _evaluate_shards(rank, shuffle=True)
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        torch.distributed.destroy_process_group()


def hand_top2(scores: torch.Tensor, target: torch.Tensor) -> float:
    top2 = [sorted(range(C), key=lambda c: (-row[c], c))[:2] for row in scores.tolist()]
    return sum(t in best for t, best in zip(target.tolist(), top2)) / len(top2)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_process_gloo_evaluation_equals_single_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]

    _, scores, target = make_data()
    expected_acc = {
        "acc/top1": accuracy_score(target.numpy(), scores.argmax(1).numpy()),
        "acc/top2": hand_top2(scores, target),
    }
    for rank, report in enumerate(reports):
        assert report["is_distributed"] and report["dist_info"] == [rank, WORLD]
        assert report["is_main"] == (rank == 0)
        assert report["all_reduce"] == {"sum": [3.0, 30.0], "mean": [1.5, 15.0], "max": [2.0, 20.0], "min": [1.0, 10.0]}
        assert report["broadcast"] == {"from": 1}
        assert report["all_gather"] == [["rank", 0], ["rank", 1]]
        assert report["master_only"] == ("ran" if rank == 0 else None)
        for mode in ("sequential", "shuffled"):
            run = report[mode]
            assert run["local_samples"] == (N + 1) // 2  # each rank holds a padded shard
            assert run["metrics"] == pytest.approx({**expected_acc, "count": N})  # same dict on every rank
            assert run["padded"] != pytest.approx(expected_acc)  # the duplicate sample would skew it
    # the per-sample metric saw every dataset index once, in the sampler's order
    assert reports[0]["sequential"]["order"] == list(range(N))
    g = torch.Generator().manual_seed(5)
    assert reports[0]["shuffled"]["order"] == torch.randperm(N, generator=g).tolist()
