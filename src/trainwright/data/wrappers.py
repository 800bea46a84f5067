"""mmengine's dataset wrappers, built from configs: ``ConcatDataset``, ``RepeatDataset`` and ``ClassBalancedDataset``
(in ``DATASETS``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch.utils.data import ConcatDataset as _TorchConcat
from torch.utils.data import Dataset

from trainwright.registry import DATASETS


def _built(dataset: Dataset | Mapping[str, Any]) -> Dataset:
    return DATASETS.build(dataset) if isinstance(dataset, Mapping) else dataset


@DATASETS.register_module()
class ConcatDataset(_TorchConcat):
    """The datasets one after the other (mmengine's; each a dataset or its ``dict(type=...)``).

    ``lazy_init`` and ``ignore_keys`` (mmengine's metainfo checks) are accepted and unused.
    """

    def __init__(
        self, datasets: Sequence[Dataset | Mapping[str, Any]], lazy_init: bool = False, ignore_keys: Any = None
    ) -> None:
        super().__init__([_built(d) for d in datasets])

    def get_cat_ids(self, idx: int) -> list[int]:
        """The category ids of sample ``idx``, from the dataset that holds it."""
        if idx < 0:
            idx += len(self)
        which = next(i for i, end in enumerate(self.cumulative_sizes) if idx < end)
        start = self.cumulative_sizes[which - 1] if which else 0
        return _cat_ids(self.datasets[which], idx - start)


@DATASETS.register_module()
class RepeatDataset(Dataset):
    """``dataset`` repeated ``times`` times: an epoch is ``times`` passes over it (mmengine's; fewer epoch ends for a
    small set).

    ``lazy_init`` is accepted and unused.
    """

    def __init__(self, dataset: Dataset | Mapping[str, Any], times: int, lazy_init: bool = False) -> None:
        if not isinstance(times, int) or times < 1:
            raise ValueError(f"RepeatDataset times must be an int >= 1, got {times!r}")
        self.dataset = _built(dataset)
        self.times = times
        self._n = len(self.dataset)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.times * self._n

    def __getitem__(self, idx: int) -> Any:
        if not -len(self) <= idx < len(self):
            raise IndexError(f"RepeatDataset index {idx} out of range for {len(self)} samples")
        return self.dataset[idx % self._n]

    def get_cat_ids(self, idx: int) -> list[int]:
        """The category ids of sample ``idx`` (of the wrapped dataset's ``idx % len``)."""
        return _cat_ids(self.dataset, idx % self._n)


def _cat_ids(dataset: Dataset, idx: int) -> list[int]:
    get = getattr(dataset, "get_cat_ids", None)
    if get is None:
        raise TypeError(
            f"ClassBalancedDataset needs the category ids of each sample, but {type(dataset).__name__} has no "
            "get_cat_ids(idx) method; add one that returns the list of category ids present in sample idx "
            "(mmdet's and mmpretrain's datasets have it)."
        )
    return list(get(idx))


@DATASETS.register_module()
class ClassBalancedDataset(Dataset):
    """Oversample the samples of rare categories (mmengine's; LVIS's repeat-factor sampling, Gupta et al. 2019).

    A category ``c`` present in a fraction ``f(c)`` of the samples gets the repeat factor
    ``r(c) = max(1, sqrt(oversample_thr / f(c)))``; a sample repeats ``ceil(max r(c))`` times over
    its categories (once with none), deterministically, so an epoch is longer than the dataset.
    The dataset must have ``get_cat_ids(idx)``. ``lazy_init`` is accepted and unused.
    """

    def __init__(self, dataset: Dataset | Mapping[str, Any], oversample_thr: float, lazy_init: bool = False) -> None:
        self.dataset = _built(dataset)
        self.oversample_thr = float(oversample_thr)
        n = len(self.dataset)  # type: ignore[arg-type]
        cats = [set(_cat_ids(self.dataset, i)) for i in range(n)]
        count: dict[int, int] = {}
        for present in cats:
            for c in present:
                count[c] = count.get(c, 0) + 1
        repeat = {c: max(1.0, math.sqrt(self.oversample_thr / (k / n))) for c, k in count.items()}
        self.repeat_indices = [
            i
            for i, present in enumerate(cats)
            for _ in range(math.ceil(max((repeat[c] for c in present), default=1.0)))
        ]

    def __len__(self) -> int:
        return len(self.repeat_indices)

    def __getitem__(self, idx: int) -> Any:
        return self.dataset[self.repeat_indices[idx]]

    def get_cat_ids(self, idx: int) -> list[int]:
        """The category ids of sample ``idx`` (of the wrapped sample it repeats)."""
        return _cat_ids(self.dataset, self.repeat_indices[idx])
