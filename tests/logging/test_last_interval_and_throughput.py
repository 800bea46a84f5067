"""The last, short interval of a run is logged everywhere; throughput fields say what they count."""

from __future__ import annotations

import csv
from typing import Any

import pytest
import torch
from conftest import LinearReg, RecordLosses, regression_set, train_records
from torch.utils.data import DataLoader, Dataset

from trainwright.logging.throughput import batch_size, num_tokens


def _mean(ref: RecordLosses, lo: int, hi: int) -> float:
    window = [ref.losses[i] for i in range(lo, hi + 1)]
    return sum(window) / len(window)


def test_iteration_run_logs_its_last_short_interval_to_every_writer(trainer_factory: Any) -> None:
    """50 iterations logged every 20: lines at 20, 40 and 50, the last averaging 41-50 (detectron2's PeriodicWriter)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ref = RecordLosses()
    t = trainer_factory(
        dataset=regression_set(16),
        batch_size=4,
        train_cfg=dict(by_epoch=False, max_iters=50),
        log_level="INFO",
        custom_hooks=[ref],
        default_hooks=dict(checkpoint=None, logger=dict(interval=20, flush_secs=3600.0)),
        writers=["console", "jsonl", "csv", "tensorboard"],
    )
    t.train()
    t.close()
    recs = train_records(t.run_dir)
    assert [r["iter"] for r in recs] == [20, 40, 50]
    for r, (lo, hi) in zip(recs, [(1, 20), (21, 40), (41, 50)]):
        assert r["loss"] == pytest.approx(_mean(ref, lo, hi), rel=1e-12, abs=0)
    console = [ln for ln in (t.run_dir / "train.log").read_text().splitlines() if "Iter(train)" in ln]
    assert [ln.split("Iter(train) ")[1][:7] for ln in console] == ["[20/50]", "[40/50]", "[50/50]"]
    assert f"loss: {recs[-1]['loss']:.4f}" in console[-1]
    with open(t.run_dir / "csv" / "train.csv", newline="") as f:
        assert [(int(row["iter"]), float(row["loss"])) for row in csv.DictReader(f)] == [
            (r["iter"], r["loss"]) for r in recs
        ]
    acc = EventAccumulator(str(t.run_dir / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [20, 40, 50]
    assert acc.Scalars("train/loss")[-1].value == pytest.approx(recs[-1]["loss"], rel=1e-6)


def test_epoch_run_logs_each_epoch_tail_once_and_the_run_end_even_with_ignore_last(trainer_factory: Any) -> None:
    ref = RecordLosses()
    t = trainer_factory(
        dataset=regression_set(28),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        custom_hooks=[ref],  # 7 iterations per epoch
        default_hooks=dict(checkpoint=None, logger=dict(interval=5, flush_secs=0.0)),
    )
    t.train()
    recs = train_records(t.run_dir)
    assert [r["iter"] for r in recs] == [
        5,
        7,
        12,
        14,
    ]  # the interval counted within each epoch (mmengine's every_n_inner_iters)
    for r, (lo, hi) in zip(recs, [(1, 5), (6, 7), (8, 12), (13, 14)]):
        assert r["loss"] == pytest.approx(_mean(ref, lo, hi), rel=1e-12, abs=0)
    ref2 = RecordLosses()
    t2 = trainer_factory(
        dataset=regression_set(28),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        custom_hooks=[ref2],
        default_hooks=dict(checkpoint=None, logger=dict(interval=5, ignore_last=True)),
    )
    t2.train()
    recs2 = train_records(t2.run_dir)
    assert [r["iter"] for r in recs2] == [5, 12, 14]  # the first epoch's tail is skipped, the run's end is not
    assert recs2[-1]["loss"] == pytest.approx(_mean(ref2, 13, 14), rel=1e-12, abs=0)


class TokenBatches(Dataset):
    """Dict samples with a padded attention mask: sample i has i % 5 + 1 real tokens of 6."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        mask = torch.zeros(6, dtype=torch.long)
        mask[: i % 5 + 1] = 1
        return {"x": torch.full((4,), float(i)), "y": torch.tensor([float(i)]), "attention_mask": mask}


class DictReg(LinearReg):
    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        mode: str = "tensor",
    ) -> Any:
        return super().forward(x, y, mode)


def test_throughput_fields_count_the_logged_batch_per_second(trainer_factory: Any) -> None:
    loader = DataLoader(TokenBatches(), batch_size=3)
    t = trainer_factory(
        model=DictReg(),
        train_dataloader=loader,
        train_cfg=dict(by_epoch=True, max_epochs=1),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=1e-4)),
        default_hooks=dict(checkpoint=None, logger=dict(interval=2)),
    )
    t.train()
    recs = train_records(t.run_dir)
    assert [r["iter"] for r in recs] == [2, 4]
    masks = [b["attention_mask"] for b in loader]
    for r in recs:
        assert r["samples_per_s"] > 0 and r["tokens_per_s"] > 0
        assert r["samples_per_s"] == pytest.approx(
            3 / r["time"], rel=1e-9
        )  # the logged batch's 3 samples / mean iteration time
        tokens = int(masks[r["iter"] - 1].sum())  # padding not counted
        assert r["tokens_per_s"] == pytest.approx(tokens / r["time"], rel=1e-9)
        assert "max_memory_mb" not in r  # CPU: no CUDA memory to report


@pytest.mark.cuda
def test_peak_cuda_memory_is_logged_on_gpu(trainer_factory: Any) -> None:
    t = trainer_factory(
        dataset=regression_set(16), batch_size=4, default_hooks=dict(checkpoint=None, logger=dict(interval=2))
    )
    t.train()
    for r in train_records(t.run_dir):
        assert r["max_memory_mb"] > 0
    weights = sum(p.numel() * p.element_size() for p in t.unwrapped_model.parameters()) / 2**20
    assert all(
        r["max_memory_mb"] >= weights for r in train_records(t.run_dir)
    )  # each line's own peak holds at least the weights


def test_batch_size_and_token_rules() -> None:
    x = torch.zeros(5, 3)
    assert batch_size(x) == 5
    assert batch_size((x, torch.zeros(5))) == 5  # default collate of (inputs, targets)
    assert (
        batch_size({"inputs": [torch.zeros(3, 8, 8)] * 4, "data_samples": [None] * 4}) == 4
    )  # mmengine pseudo-collate
    assert batch_size({"input_ids": torch.zeros(2, 7)}) == 2
    assert batch_size({"batch_size": 9, "input_ids": torch.zeros(2, 7)}) == 9
    assert batch_size([{"a": 1}, {"a": 2}]) == 2  # a list of samples
    assert batch_size(torch.tensor(1.0)) is None and batch_size(object()) is None
    assert num_tokens((x,)) is None and num_tokens({"x": x}) is None
    assert num_tokens({"num_tokens": 17, "attention_mask": torch.ones(2, 3)}) == 17
    assert int(num_tokens({"attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])})) == 3
    assert num_tokens({"input_ids": torch.zeros(2, 7)}) == 14


def test_default_logging_costs_no_per_step_calls(trainer_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The throughput fields are read at logging iterations only: batch_size runs once per line, not per step."""
    import trainwright.hooks.logger as logger_mod

    calls = []
    real = logger_mod.batch_size
    monkeypatch.setattr(logger_mod, "batch_size", lambda b: calls.append(1) or real(b))
    t = trainer_factory(
        dataset=regression_set(40),
        batch_size=2,
        train_cfg=dict(by_epoch=False, max_iters=35),
        default_hooks=dict(checkpoint=None, logger=dict(interval=10)),
    )
    t.train()
    assert len(calls) == len(train_records(t.run_dir)) == 4  # 10, 20, 30, 35
