"""mmengine's dataset wrappers, built from configs: ``ConcatDataset`` and ``RepeatDataset`` (in ``DATASETS``)."""

from __future__ import annotations

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

    def __init__(self, datasets: Sequence[Dataset | Mapping[str, Any]], lazy_init: bool = False, ignore_keys: Any = None) -> None:
        super().__init__([_built(d) for d in datasets])


@DATASETS.register_module()
class RepeatDataset(Dataset):
    """``dataset`` repeated ``times`` times: an epoch is ``times`` passes over it (mmengine's; fewer epoch ends for a small set).

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
