"""Under several processes the trainer shards the val / test loaders (no processes needed: a strategy that says it is
rank 1 of 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import LinearReg
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import trainwright as tw
from trainwright.strategies.single_device import SingleDeviceStrategy


class RankOneOfTwo(SingleDeviceStrategy):
    """Says it is rank 1 of 2 without a process group (it cannot broadcast rank 0's run folder name: the tests name
    it)."""

    def __init__(self) -> None:
        super().__init__(device="cpu")

    @property
    def rank(self) -> int:
        return 1

    @property
    def world_size(self) -> int:
        return 2


class Stream(IterableDataset):
    def __iter__(self):  # noqa: ANN204
        yield from (torch.zeros(4) for _ in range(3))


def test_val_and_test_loaders_read_this_ranks_padded_shard(tmp_path: Path) -> None:
    ds = TensorDataset(torch.arange(7).float())
    t = tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        strategy=RankOneOfTwo(),
        experiment_name="shard",
        val_dataloader=DataLoader(ds, batch_size=2),
        test_dataloader=dict(dataset=ds, batch_size=3),
        log_level="WARNING",
    )
    assert t.val_loop is not None and t.test_loop is not None
    # DistributedSampler order for rank 1 of 2 over 7 samples: 1, 3, 5 and the padding (sample 0)
    assert [b[0].tolist() for b in t.val_loop.dataloader] == [[1.0, 3.0], [5.0, 0.0]]
    assert [b[0].tolist() for b in t.test_loop.dataloader] == [[1.0, 3.0, 5.0], [0.0]]
    t.close()


class RankZeroOfTwo(RankOneOfTwo):
    """Rank 0 of 2: the rank that prints the run's warnings (the others print only those naming them)."""

    @property
    def rank(self) -> int:
        return 0


def test_an_iterable_val_set_under_several_processes_warns_with_the_fix(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="give each rank its own part of the data"):
        t = tw.Trainer(
            model=LinearReg(),
            work_dir=tmp_path,
            strategy=RankZeroOfTwo(),
            experiment_name="shard",
            val_dataloader=DataLoader(Stream(), batch_size=2),
            log_level="WARNING",
        )
    t.close()
