"""Streams for the data tests: numbered samples as local JSON-lines shards read by Hugging Face ``datasets``
(streaming), and a plain iterable of numbered samples."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset


def write_shards(folder: Path, shards: int, per_shard: int | list[int], first: int = 0) -> list[str]:
    """``shards`` JSON-lines files of ``{"id": n}`` records (``per_shard`` each, or the list's count for each shard),
    ids ``first, first + 1, ...`` shard after shard."""
    folder.mkdir(parents=True, exist_ok=True)
    sizes = per_shard if isinstance(per_shard, list) else [per_shard] * shards
    files, start = [], first
    for s, size in enumerate(sizes):
        f = folder / f"shard{s:02d}.jsonl"
        f.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(start, start + size)))
        files.append(str(f))
        start += size
    return files


def hf_stream(files: list[str]) -> Any:
    """The shards as a Hugging Face streaming ``IterableDataset`` (one shard per file)."""
    import datasets

    return datasets.load_dataset("json", data_files=files, split="train", streaming=True)


def sample_id(sample: Any) -> int:
    """The id of a sample: a record ``{"id": n}``, an int, or a ``(x, y)`` pair whose ``x[0]`` is the id."""
    if isinstance(sample, dict):
        return int(sample["id"])
    if isinstance(sample, (tuple, list)):
        return int(sample[0][0])
    return int(sample)


def ids_of(samples: list[Any]) -> list[int]:
    """A collate function: the batch as its samples' ids."""
    return [sample_id(s) for s in samples]


class Numbered(IterableDataset):
    """``n`` samples ``(x, y)`` whose ``x[0]`` is the id (``first + i``); ``__len__`` is ``length`` (default ``n``)."""

    def __init__(self, n: int, first: int = 0, length: int | None = None) -> None:
        self.n, self.first, self.length = n, first, n if length is None else length

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.first, self.first + self.n):
            yield torch.tensor([float(i), 1.0, 0.0, -1.0]), torch.tensor([0.5])

    def __len__(self) -> int:
        return self.length


class Counted(IterableDataset):
    """``n`` samples ``(x, y)`` whose ``x[0]`` is the id (``first + i``), with torchdata's state convention:
    ``state_dict()`` is the count given, ``load_state_dict`` sets where the next pass starts. No ``__len__``."""

    def __init__(self, first: int = 1000, n: int = 100) -> None:
        self.first, self.n = first, n
        self.done, self._start = 0, 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        start, self._start = self._start, 0
        self.done = start
        for i in range(self.first + start, self.first + self.n):
            self.done += 1
            yield torch.tensor([float(i), 1.0, 0.0, -1.0]), torch.tensor([0.5])

    def state_dict(self) -> dict[str, int]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = int(state["done"])
