"""ResumableLoader on its own: position, epoch, resume in the middle and at the very end of an epoch."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from trainwright.data.loader import build_dataloader

N, BS = 20, 4  # 5 batches per epoch


def _loader(workers: int = 0) -> Any:
    ds = TensorDataset(torch.arange(N))
    return build_dataloader(DataLoader(ds, batch_size=BS, shuffle=True, num_workers=workers), seed=7)


def _ids(batches: Any) -> list[list[int]]:
    return [b[0].tolist() for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_position_epoch_and_mid_epoch_resume_match_an_uninterrupted_pass(workers: int) -> None:
    ref = _loader(workers)
    first, second = _ids(ref), _ids(ref)  # two whole epochs
    assert ref.epoch == 2 and ref.position == 0
    assert sorted(sum(first, [])) == list(range(N)) and first != second  # reshuffled per epoch

    a = _loader(workers)
    it = iter(a)
    got = _ids(itertools.islice(it, 2))
    assert a.position == 2 and a.epoch == 0  # counts batches handed out, not prefetched ones
    state = a.state_dict()
    b = _loader(workers)
    b.load_state_dict(state)
    assert got + _ids(b) == first  # the rest of the epoch, nothing replayed
    assert b.epoch == 1 and b.position == 0
    assert _ids(b) == second


def test_stopping_right_after_the_last_batch_resumes_into_the_next_epoch() -> None:
    ref = _loader()
    _ids(ref)
    second = _ids(ref)
    a = _loader()
    it = iter(a)
    _ids(itertools.islice(it, 5))  # all 5 batches taken, the end of the epoch not yet seen
    assert a.state_dict()["position"] == 5 and a.epoch == 0
    b = _loader()
    b.load_state_dict(a.state_dict())
    assert _ids(b) == []  # the finished epoch is closed by an empty pass
    assert b.epoch == 1
    assert _ids(b) == second


def test_an_unfinished_pass_is_continued_by_the_next_iteration() -> None:
    ref = _loader()
    first = _ids(ref)
    a = _loader()
    head = _ids(itertools.islice(iter(a), 3))
    assert head + _ids(a) == first  # iterating again continues where the loop stopped


class Stream(IterableDataset):
    def __iter__(self) -> Any:
        return iter(torch.arange(N).split(BS))

    def __len__(self) -> int:
        return N // BS


def test_iterable_datasets_count_as_they_go_and_replay_to_resume() -> None:
    a = build_dataloader(DataLoader(Stream(), batch_size=None))
    it = iter(a)
    head = [b.tolist() for b in itertools.islice(it, 2)]
    assert a.position == 2
    b = build_dataloader(DataLoader(Stream(), batch_size=None))
    b.load_state_dict(a.state_dict())
    with pytest.warns(UserWarning, match="consuming 2 batches"):
        rest = [x.tolist() for x in b]
    assert head + rest == [t.tolist() for t in torch.arange(N).split(BS)]
    assert b.epoch == 1 and b.position == 0


@pytest.mark.parametrize("shuffle", [False, True])
def test_epoch_sampler_shards_as_distributed_sampler(shuffle: bool) -> None:
    """Every rank's indices, padded shards included, are torch's ``DistributedSampler``'s (same seed and epoch), for
    every length and world size."""
    from torch.utils.data import DistributedSampler

    from trainwright.data.loader import EpochSampler

    for n in (1, 2, 5, 7, 16, 33):
        for replicas in (1, 2, 3, 4, 8):
            for rank in range(replicas):
                ours = EpochSampler(n, shuffle=shuffle, seed=3, num_replicas=replicas, rank=rank)
                ref = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=3)
                for epoch in (0, 1):
                    ours.set_epoch(epoch)
                    ref.set_epoch(epoch)
                    assert list(ours) == list(ref), (n, replicas, rank, epoch)
                    assert len(ours) == len(ref)
