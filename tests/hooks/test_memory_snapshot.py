"""MemorySnapshotHook (CUDA snapshots of chosen iterations) and the peak memory per phase in the log."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import make_trainer, regression_set
from torch import nn
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.evaluation.metric import Metric
from trainwright.hooks import MemorySnapshotHook
from trainwright.hooks.phase_peaks import PhasePeaks


def test_cpu_run_says_the_hook_needs_cuda_and_writes_nothing(tmp_path: Path) -> None:
    t = make_trainer(
        tmp_path,
        custom_hooks=[dict(type="MemorySnapshotHook", iters=(2, 3))],
        train_cfg=dict(by_epoch=False, max_iters=4),
    )
    t.train()
    t.close()
    log = (t.run_dir / "train.log").read_text()
    assert "MemorySnapshotHook needs a CUDA device" in log and "no memory snapshot is written" in log
    assert not list(t.run_dir.rglob("*.pickle"))


@pytest.mark.parametrize("iters", [(3, 2), (0, 2), (1, 2, 3), "10"])
def test_bad_window_is_refused(iters: Any) -> None:
    with pytest.raises(ValueError, match=r"iters must be \(first, last\)"):
        MemorySnapshotHook(iters=iters)


class _Allocator:
    """A stand-in allocator with torch's peak semantics: the peak since the last reset, a reset sets it to what is
    allocated now."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def alloc(self, n: int) -> None:
        self.now += n
        self.peak = max(self.peak, self.now)

    def free(self, n: int) -> None:
        self.now -= n

    def reset(self) -> None:
        self.peak = self.now


def test_phase_peaks_keep_evaluation_and_saves_out_of_training_lines() -> None:
    mib = 2**20
    a = _Allocator()
    a.alloc(500 * mib)  # the model, built before training
    peaks = PhasePeaks(lambda: a.peak, a.reset)
    peaks.start()
    a.alloc(100 * mib)  # an iteration's activations
    a.free(100 * mib)
    assert peaks.train_peak() == 600  # the model and the line's activations, not more
    a.alloc(50 * mib)
    a.free(50 * mib)
    assert peaks.begin("eval") is None  # training's 550 so far kept for the next line
    a.alloc(900 * mib)  # a large evaluation batch
    a.free(900 * mib)
    assert peaks.begin("train") == 1400
    a.alloc(20 * mib)
    a.free(20 * mib)
    assert peaks.train_peak() == 550  # the evaluation is not in the training line
    assert peaks.begin("save") is None
    a.alloc(300 * mib)  # gathering a checkpoint
    a.free(300 * mib)
    assert peaks.begin("train") == 800
    assert peaks.train_peak() == 500
    peaks.begin("save")  # a save inside an epoch: the iterations after it count with it in the next line
    a.alloc(70 * mib)
    a.free(70 * mib)
    assert peaks.train_peak() == 570


def test_cpu_records_carry_no_memory(tmp_path: Path) -> None:
    t = make_trainer(tmp_path, default_hooks=dict(checkpoint=None, logger=dict(interval=2)))
    t.train()
    t.close()
    recs = [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert recs and not any("max_memory_mb" in r for r in recs)


class _BigEval(tw.BaseModel):
    """Evaluation allocates a 64 MiB scratch tensor per batch; training allocates little."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.linear(x)
        if mode == "loss":
            return {"loss": F.mse_loss(out, y)}
        scratch = torch.ones(16 * 2**20, device=x.device)  # 64 MiB of float32
        return out + scratch[:1].sum() * 0


class _MSE(Metric):
    def process(self, data_batch: Any, outputs: Any) -> None:
        self.results.append(float(((outputs.cpu() - data_batch[1]) ** 2).mean()))

    def compute(self, results: list[float]) -> dict[str, float]:
        return {"mse": sum(results) / len(results)}


@pytest.mark.cuda
def test_cuda_snapshot_and_peaks_per_phase(tmp_path: Path) -> None:
    data = regression_set(16)
    t = tw.Trainer(
        model=_BigEval(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(data, batch_size=4),
        val_dataloader=DataLoader(data, batch_size=4),
        val_evaluator=_MSE(),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        default_hooks=dict(logger=dict(interval=2), checkpoint=dict(interval=1)),
        custom_hooks=[MemorySnapshotHook(iters=(2, 3), out="snap/mem.pickle")],
        log_level="INFO",
        randomness=dict(seed=0),
    )
    t.train()
    t.close()
    path = t.run_dir / "snap" / "mem.pickle"
    with path.open("rb") as f:
        snapshot = pickle.load(f)
    assert snapshot["segments"] and snapshot["device_traces"]  # what pytorch.org/memory_viz reads
    recs = [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r["max_memory_mb"] for r in recs if r["mode"] == "train"]
    val = [r["max_memory_mb"] for r in recs if r["mode"] == "val"]
    # the evaluation's 64 MiB scratch tensor is in the evaluation lines, not in the training lines; both hold what stays
    # allocated (on an H100 the cuBLAS workspaces, about 64 MiB, made the training peak 66.4 MiB)
    assert train and all(m > 0 for m in train), train
    assert len(val) == 2 and all(v >= max(train) + 63 for v in val), (train, val)
    log = (t.run_dir / "train.log").read_text()
    assert (
        "Wrote the CUDA memory snapshot of iterations 2-3" in log
        and "Checkpoint save at iteration 4: peak memory allocated" in log
    )


def test_hook_is_registered_and_exported() -> None:
    from trainwright.registry import HOOKS

    assert isinstance(HOOKS.build(dict(type="MemorySnapshotHook", iters=5)), MemorySnapshotHook)
    assert MemorySnapshotHook(iters=5).iters == (5, 5)
