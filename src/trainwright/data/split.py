"""Streams under several processes: each rank (and loader worker) reads its own part; uneven ends stop together.

:func:`split_stream` gives a rank its part of an iterable dataset (Hugging Face's ``split_dataset_by_node`` for a
``datasets.IterableDataset``, a :class:`StreamShard` for any other iterable); :class:`EvenEnd` ends a pass over the
data on every rank at the same batch when one rank's part runs out first.
"""

from __future__ import annotations

import itertools
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from trainwright.data.loader_args import carried_arguments

__all__ = [
    "EvenEnd",
    "StreamShard",
    "is_hf_stream",
    "is_stream",
    "split_loader",
    "split_note",
    "split_stream",
    "warn_unsplit",
    "worker_slot",
]

#: How many batches a rank counts when its part is left unread at an agreed end (bounds the count of an endless stream).
UNREAD_LIMIT = 10_000


def is_stream(loader: Any) -> bool:
    """Whether ``loader`` (a DataLoader or a :class:`~trainwright.data.loader.ResumableLoader`) reads an iterable
    dataset."""
    return isinstance(getattr(loader, "dataset", None), IterableDataset)


def is_hf_stream(dataset: Any) -> bool:
    """Whether ``dataset`` is a Hugging Face ``datasets.IterableDataset`` (which splits itself among loader workers)."""
    hf = sys.modules.get("datasets")  # never imported here: a dataset of that kind means it is loaded already
    return hf is not None and isinstance(dataset, getattr(hf, "IterableDataset", ()))


def worker_slot(rank: int = 0, world: int = 1) -> tuple[int, int]:
    """``(slot, slots)``: this (rank, loader worker)'s place among all readers, ``rank * workers + worker`` of
    ``world * workers``."""
    info = get_worker_info()
    workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
    return rank * workers + worker, world * workers


class StreamShard(IterableDataset):
    """Rank ``rank``'s part of any iterable: each (rank, loader worker) takes every ``world * workers``-th item.

    Every reader iterates the whole stream and keeps its own items (the other items are read and dropped: a stream
    that can split its sources, e.g. by files, is cheaper split there). ``len()`` (when the stream has one) is the
    largest part, the same on every rank. The position is in :meth:`state_dict` (the count of the stream's items read,
    and the stream's own state when it has one), so a resume goes on where this reader stopped.

    Args:
        dataset: The iterable (an ``IterableDataset`` or any object with ``__iter__``).
        rank: This process's part, in ``range(world)``.
        world: How many processes share the stream.
    """

    def __init__(self, dataset: Iterable[Any], rank: int, world: int) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"StreamShard rank must be in [0, world), got rank={rank}, world={world}")
        self.dataset = dataset
        self.rank = rank
        self.world = world
        self._read = 0  # items of the stream read so far (this reader's, in a worker)
        self._inner: dict[str, Any] | None = None  # the stream's own state, when it has one

    @property
    def split_note(self) -> str:
        """How the stream is split, in words (logged when training starts)."""
        return (
            f"{type(self.dataset).__name__} split by rank x loader worker: each reads every (world x workers)-th item "
            f"(rank {self.rank} of {self.world})"
        )

    def __len__(self) -> int:
        if not isinstance(self.dataset, Sized):
            raise TypeError(f"{type(self.dataset).__name__} has no __len__")
        return -(-len(self.dataset) // self.world)

    def __iter__(self) -> Iterator[Any]:
        slot, slots = worker_slot(self.rank, self.world)
        start = self._read
        load = getattr(self.dataset, "load_state_dict", None)
        if self._inner is not None and load is not None:
            load(self._inner)  # the stream goes on by itself from ``start``
            items: Iterator[Any] = iter(self.dataset)
        else:
            items = itertools.islice(iter(self.dataset), start, None)  # no state of its own: read past what was read
        for i, item in enumerate(items, start):
            self._read = i + 1
            if i % slots == slot:
                yield item
        self._read, self._inner = 0, None  # the stream ended: the next pass starts it again

    def state_dict(self) -> dict[str, Any]:
        """``{"read": items of the stream read, "inner": the stream's state_dict() or None}``."""
        own = getattr(self.dataset, "state_dict", None)
        return {"read": self._read, "inner": own() if own is not None and self._read else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on after ``state["read"]`` items of the stream (from its own state when it has one, else by reading past
        them)."""
        self._read = int(state["read"])
        self._inner = state.get("inner")


def split_stream(dataset: Any, rank: int, world: int) -> Any:
    """Rank ``rank``'s part of the iterable ``dataset``, read by ``world`` processes.

    A Hugging Face ``datasets.IterableDataset``: ``datasets.distributed.split_dataset_by_node`` (whole shards per rank
    when their count divides by ``world``; the loader's workers then split a rank's shards themselves). An object with
    ``split_by_node(rank, world)`` (a :class:`~trainwright.data.mixture.Mixture`): what it returns. Any other iterable:
    a :class:`StreamShard`.
    """
    if world <= 1:
        return dataset
    if is_hf_stream(dataset):
        from datasets.distributed import split_dataset_by_node

        return split_dataset_by_node(dataset, rank=rank, world_size=world)
    own = getattr(dataset, "split_by_node", None)
    if callable(own):
        return own(rank, world)
    return StreamShard(dataset, rank, world)


def split_note(dataset: Any) -> str:
    """How a split stream is split, in words."""
    note = getattr(dataset, "split_note", None)
    if isinstance(note, str):
        return note
    if is_hf_stream(dataset):
        return (
            "Hugging Face IterableDataset split by datasets.distributed.split_dataset_by_node (whole shards per rank "
            "when their count divides by the world size, else every world-th example)"
        )
    return f"{type(dataset).__name__} split by rank"


def split_loader(loader: DataLoader, rank: int, world: int, name: str = "train_dataloader") -> DataLoader:
    """``loader`` rebuilt over rank ``rank``'s part of its stream (same batching, workers and class); a map-style
    loader, or one process, unchanged."""
    dataset = loader.dataset
    if world <= 1 or not isinstance(dataset, IterableDataset):
        return loader
    kwargs = dict(
        batch_size=loader.batch_size, drop_last=loader.drop_last, **carried_arguments(loader, loader.generator)
    )
    snapshot = getattr(loader, "snapshot_every_n_steps", None)  # torchdata's StatefulDataLoader
    if snapshot is not None:
        kwargs["snapshot_every_n_steps"] = snapshot
    try:
        return type(loader)(split_stream(dataset, rank, world), **kwargs)
    except TypeError as e:
        raise TypeError(
            f"{name}: could not rebuild {type(loader).__name__} over rank {rank}'s part of its stream ({e}). Give "
            f"{name} as a dict of DataLoader arguments, or split the stream yourself and pass split_stream=False"
        ) from e


_END = object()


class EvenEnd:
    """One pass over the batches of a rank's stream that ends on every rank at the same batch.

    Before each batch is trained every rank says whether it has one (one all-gather of one number per iteration);
    when some rank has none, every rank stops there. The ranks that still had batches count what they leave unread
    (up to :data:`UNREAD_LIMIT`; reading them also closes the loader's pass), and :attr:`unread` holds every rank's
    count, the same on every rank.

    Args:
        gather: Every rank's 1-D float64 tensor stacked in rank order (``Strategy.all_gather``, the agreement's).
    """

    def __init__(self, gather: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.gather = gather
        #: Batches each rank left unread at the last agreed end, in rank order (None: the last pass ended evenly).
        self.unread: list[int] | None = None

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        """The batches of one pass, stopped on every rank when the first rank's run out."""
        self.unread = None
        it = iter(batches)
        while True:
            batch = next(it, _END)
            ended = self.gather(torch.tensor([1.0 if batch is _END else 0.0], dtype=torch.float64))
            if bool(ended.any()):
                break
            yield batch
        if bool(ended.all()):
            return  # every rank's part ended with this batch: nothing left unread
        unread = 0 if batch is _END else 1 + sum(1 for _ in itertools.islice(it, UNREAD_LIMIT - 1))
        counts = self.gather(torch.tensor([float(unread)], dtype=torch.float64))
        self.unread = [int(c) for c in counts.reshape(-1).tolist()]

    def describe(self, iteration: int) -> str:
        """The log line of an uneven end after ``iteration``."""
        assert self.unread is not None
        left = ", ".join(f"rank {r}: {n}{'+' if n >= UNREAD_LIMIT else ''}" for r, n in enumerate(self.unread))
        return (
            f"train_dataloader's stream ended unevenly across ranks: every rank stopped this pass after iteration "
            f"{iteration}; batches left unread: {left}"
        )


def warn_unsplit(name: str, world: int) -> None:
    """A stream given under several processes with ``split_stream=False``: each rank reads what its stream yields."""
    warnings.warn(
        f"{name} is a stream read by {world} processes with split_stream=False: each rank reads everything its "
        "dataset yields. Make sure each rank's dataset yields its own part (else every rank trains on the same "
        "samples).",
        stacklevel=3,
    )
