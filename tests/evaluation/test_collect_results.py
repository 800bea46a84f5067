"""Reordering rank-interleaved results: checked against torch's own DistributedSampler."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler

from trainwright.evaluation import merge_rank_results


def shards(n: int, world: int, shuffle: bool) -> tuple[list[int], list[list[int]]]:
    """The sampler's padded global order, and what each rank sees of it."""
    dataset = list(range(n))
    parts = [
        list(DistributedSampler(dataset, num_replicas=world, rank=r, shuffle=shuffle, seed=3)) for r in range(world)
    ]
    g = torch.Generator().manual_seed(3)
    order = torch.randperm(n, generator=g).tolist() if shuffle else list(range(n))
    return order, parts


@pytest.mark.parametrize("n", [1, 7, 12, 13])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [False, True])
def test_per_sample_results_come_back_in_sampler_order_without_padding(n: int, world: int, shuffle: bool) -> None:
    order, parts = shards(n, world, shuffle)
    merged = merge_rank_results(parts, n)
    assert merged == order
    assert sorted(merged) == list(range(n))


@pytest.mark.parametrize("n", [1, 7, 13])
@pytest.mark.parametrize("world", [2, 3])
def test_batched_results_come_back_in_sampler_order_without_padding(n: int, world: int) -> None:
    order, parts = shards(n, world, shuffle=True)
    # each rank concatenated its batches: a tensor plus a dict of tensors, dim 0 = samples
    tensor_parts = [[torch.tensor(p)] for p in parts]
    dict_parts = [[{"idx": torch.tensor(p), "sq": torch.tensor(p) ** 2}] for p in parts]
    (merged,) = merge_rank_results(tensor_parts, n, batched=True)
    assert merged.tolist() == order
    (merged_dict,) = merge_rank_results(dict_parts, n, batched=True)
    assert merged_dict["idx"].tolist() == order
    assert merged_dict["sq"].tolist() == [i * i for i in order]


def test_unequal_shards_are_interleaved_round_robin() -> None:
    # a strided sampler that does not pad: rank 0 has one sample more
    parts = [[0, 2, 4], [1, 3]]
    assert merge_rank_results(parts, 5) == [0, 1, 2, 3, 4]
    (merged,) = merge_rank_results([[torch.tensor(p)] for p in parts], 5, batched=True)
    assert merged.tolist() == [0, 1, 2, 3, 4]


def test_batched_results_must_be_per_sample() -> None:
    from trainwright.evaluation import collect_results

    with pytest.raises(ValueError, match="0-dim"):
        collect_results([torch.tensor(3), torch.tensor(4)], 8, batched=True)
    with pytest.raises(TypeError, match="batched_results=False"):
        collect_results([3, 4], 8, batched=True)
