"""Trainer.find_batch_size: the largest batch that fits in CUDA memory, the trainer left as it was; a clear error
elsewhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import regression_set
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler, TensorDataset

import trainwright as tw
from trainwright.tuning import with_batch_size


def test_needs_a_device_that_reports_out_of_memory(trainer_factory: Any) -> None:
    trainer = trainer_factory()
    with pytest.raises(
        RuntimeError, match=r"needs a device that reports out-of-memory \(CUDA\): this trainer runs on 'cpu'"
    ):
        trainer.find_batch_size()
    assert trainer.train_loop is None and not trainer.prepared  # refused before anything was built


def test_with_batch_size_keeps_the_rest_of_the_loader() -> None:
    ds = regression_set(20)
    shuffled = with_batch_size(DataLoader(ds, batch_size=2, shuffle=True, drop_last=True), 8)
    assert (
        shuffled.batch_size == 8
        and shuffled.drop_last
        and isinstance(shuffled.sampler, RandomSampler)
        and shuffled.dataset is ds
    )
    assert len(shuffled) == 2
    ordered = with_batch_size(DataLoader(ds, batch_size=2), 5)
    assert isinstance(ordered.sampler, SequentialSampler) and [len(b[0]) for b in ordered] == [5, 5, 5, 5]
    assert with_batch_size(dict(dataset=ds, batch_size=2, shuffle=True), 16) == dict(
        dataset=ds, batch_size=16, shuffle=True
    )
    with pytest.raises(ValueError, match="own batch_sampler"):
        with_batch_size(dict(dataset=ds, batch_sampler=[[0, 1]]), 4)


class Count(IterableDataset):
    """0, 1, ..., n - 1 (a stream: no sampler, no __len__)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.arange(self.n))


def test_with_batch_size_on_a_stream_keeps_its_order_and_a_stateful_loader() -> None:
    # a stream's loader has no sampler to pass on: DataLoader refused the one read from it ("expected unspecified
    # sampler option")
    from torchdata.stateful_dataloader import StatefulDataLoader

    plain = with_batch_size(DataLoader(Count(10), batch_size=2, drop_last=True), 4)
    assert type(plain) is DataLoader and [b.tolist() for b in plain] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    stateful = with_batch_size(StatefulDataLoader(Count(10), batch_size=2), 3)
    assert isinstance(stateful, StatefulDataLoader) and [len(b) for b in stateful] == [3, 3, 3, 1]


class Outer(tw.BaseModel):
    """Keeps a (batch, 1024, 1024) activation for backward: about 16 MiB a sample, so a few thousand samples fill a
    GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(1024, 1024)
        self.b = nn.Linear(1024, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        h = self.a(x)
        big = torch.tanh(h.unsqueeze(2) * h.unsqueeze(1))
        out = self.b(big.mean(2))
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def _cuda_trainer(work_dir: Path, n: int) -> tw.Trainer:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, 1024, generator=g), torch.randn(n, 1, generator=g))
    return tw.Trainer(
        Outer(),
        work_dir=work_dir,
        train_dataloader=dict(dataset=ds, batch_size=2, shuffle=True),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)),
        train_cfg=dict(by_epoch=False, max_iters=3),
        default_hooks=dict(checkpoint=None),
        randomness=dict(seed=0),
        log_level="WARNING",
    )


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(k == "time" or _equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


@pytest.mark.cuda
def test_finds_the_largest_power_of_two_that_fits_and_restores(tmp_path: Path) -> None:
    n = 1 << 14  # 16384 samples of ~16 MiB each: more than any single GPU holds, so the search ends in out-of-memory
    with _cuda_trainer(tmp_path / "a", n) as trainer:
        size = trainer.find_batch_size(init=2, steps_per_trial=2)
        assert 2 <= size < n and size & (size - 1) == 0  # a power of two below the dataset
        before, allocated = trainer.checkpoints.capture(), torch.cuda.memory_allocated()
        again = trainer.find_batch_size(init=size // 2, mode="binsearch", steps_per_trial=2)
        assert size <= again < 2 * size  # bisected between the size that fit and its double, which did not
        assert _equal(
            trainer.checkpoints.capture(), before
        )  # model, optimizer (no AdamW state yet), RNG, data position: as before
        assert torch.cuda.memory_allocated() <= allocated + (1 << 20)  # the trials' graphs and gradients are gone
        assert all(p.grad is None for p in trainer.unwrapped_model.parameters())
        assert trainer.progress.iteration == 0

    with _cuda_trainer(tmp_path / "b", n) as applied:
        used = applied.find_batch_size(init=size // 4, steps_per_trial=2, apply=True)
        applied.train()
        assert applied.train_loop is not None and applied.train_loop.dataloader.batch_size == used
        assert applied.progress.iteration == 3
