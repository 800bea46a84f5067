"""ClassBalancedDataset: mmengine's repeat-factor oversampling of rare categories, built from a config."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch.utils.data import Dataset

from trainwright.data import ClassBalancedDataset
from trainwright.registry import DATASETS


class Labelled(Dataset):
    """Sample i holds the categories ``cats[i]``."""

    def __init__(self, cats: list[list[int]]) -> None:
        self.cats = cats

    def __len__(self) -> int:
        return len(self.cats)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(idx)]), idx

    def get_cat_ids(self, idx: int) -> list[int]:
        return self.cats[idx]


def test_rare_categories_repeat_by_the_square_root_rule() -> None:
    # 90 samples of category 0, 8 of category 1, 2 holding both 1 and 2, 1 with no category.
    cats = [[0]] * 90 + [[1]] * 8 + [[1, 2]] * 2 + [[]]
    balanced = ClassBalancedDataset(Labelled(cats), oversample_thr=0.5)
    n = len(cats)
    # r(c) = max(1, sqrt(t / f(c))); a sample repeats ceil(max over its categories).
    r1 = math.sqrt(0.5 / (10 / n))
    r2 = math.sqrt(0.5 / (2 / n))
    assert (math.ceil(r1), math.ceil(r2)) == (3, 6)
    times = Counter(balanced[i][1] for i in range(len(balanced)))
    assert all(times[i] == 1 for i in range(90)) and times[100] == 1
    assert all(times[i] == 3 for i in range(90, 98)) and all(times[i] == 6 for i in (98, 99))
    assert len(balanced) == 90 + 8 * 3 + 2 * 6 + 1
    assert balanced.get_cat_ids(len(balanced) - 2) == [1, 2]


def test_nested_wrappers_from_a_config_keep_the_category_ids() -> None:
    DATASETS.register_module(name="LabelledForBalance", module=Labelled, force=True)
    inner = dict(
        type="ConcatDataset",
        datasets=[dict(type="LabelledForBalance", cats=[[0]] * 9), dict(type="LabelledForBalance", cats=[[1]])],
    )
    balanced = DATASETS.build(
        dict(
            type="ClassBalancedDataset", oversample_thr=0.4, dataset=dict(type="RepeatDataset", times=2, dataset=inner)
        )
    )
    # f(1) = 2 / 20 -> r = 2: the two copies of the rare sample appear twice each.
    assert len(balanced) == 18 + 2 * 2
    assert [balanced.get_cat_ids(i) for i in range(len(balanced))].count([1]) == 4


def test_a_dataset_without_get_cat_ids_is_named_with_the_fix() -> None:
    with pytest.raises(
        TypeError, match=r"ClassBalancedDataset needs the category ids.*TensorDataset has no get_cat_ids\(idx\)"
    ):
        ClassBalancedDataset(torch.utils.data.TensorDataset(torch.zeros(4, 1)), oversample_thr=0.1)
