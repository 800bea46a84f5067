"""Resumable data loading: a deterministic per-epoch order that can restart at any batch.

:func:`make_resumable` rebuilds the user's ``DataLoader`` around a sampler whose order depends
only on ``(seed, epoch)`` and a batch sampler that skips the batches already consumed; the
global RNG is never touched. With workers, each batch is loaded under a seed of ``(seed,
epoch, batch index)``, so a sample's augmentation does not depend on which worker loads it.
"""

from __future__ import annotations

import itertools
import operator
import random
import warnings
from collections.abc import Iterator, Mapping, Sized
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    SequentialSampler,
    get_worker_info,
)

from trainwright.data.loader_args import carried_arguments, dataloader_arguments
from trainwright.data.split import split_loader, warn_unsplit
from trainwright.data.stream_state import has_state, new_stateful_loader, rebuild_stream_loader, stock_samplers
from trainwright.registry import DATASETS, ConfigError, check_keys


class EpochSampler(Sampler[int]):
    """Indices ``0..n-1`` in an order fixed by ``(seed, epoch)``; shuffled or sequential; one rank's shard.

    Under several processes (``num_replicas > 1``) every rank draws the same order, pads it
    by repeating its first indices to a multiple of ``num_replicas`` and takes every
    ``num_replicas``-th index from ``rank`` on (``DistributedSampler`` semantics): together the
    ranks' ``i``-th batches are the one-process ``i``-th batch of ``num_replicas`` times the size.

    Args:
        num_samples: Dataset length.
        shuffle: Random permutation per epoch (else sequential).
        seed: Base seed of the permutation.
        num_replicas: Number of processes sharing the data.
        rank: This process's shard.
    """

    def __init__(
        self, num_samples: int, shuffle: bool = True, seed: int = 0, num_replicas: int = 1, rank: int = 0
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(
                f"EpochSampler rank must be in [0, num_replicas), got rank={rank}, num_replicas={num_replicas}"
            )
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration yields."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        n, replicas = self.num_samples, self.num_replicas
        total = (
            len(self) * replicas
        )  # the order padded to a multiple of the replicas: position k holds its (k % n)-th index
        if not self.shuffle:  # position k holds index k % n: nothing to build
            positions = range(self.rank, total, replicas)
            return iter(positions) if total == n else map(operator.mod, positions, itertools.repeat(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=g).tolist()
        if replicas == 1:
            return iter(order)
        order += (order * (total // max(n, 1) + 1))[: total - n]
        return iter(order[self.rank : total : replicas])

    def __len__(self) -> int:
        return -(-self.num_samples // self.num_replicas)


def batch_seed(seed: int, epoch: int, batch_idx: int) -> int:
    """The seed a worker loads batch ``batch_idx`` of ``epoch`` under (a 63-bit mix of the three)."""
    mask = (1 << 63) - 1
    return (((seed * 0x9E3779B97F4A7C15 + epoch) & mask) * 0xBF58476D1CE4E5B9 + batch_idx) & mask


class SeededBatch(list):
    """A list of sample indices that also carries the seed to load it under (sent to workers)."""

    seed: int | None = None


class SkippableBatchSampler(Sampler[list[int]]):
    """Wraps a batch sampler; iterations start after ``skip`` batches (0 by default).

    When :attr:`seed` is set, every batch is a :class:`SeededBatch` whose seed depends on
    ``(seed, epoch, batch index)`` only, so a resumed epoch loads each batch under the same
    random state as the original run, whichever worker gets it.
    """

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler
        self.skip = 0
        self.seed: int | None = None
        self.epoch = 0

    def __iter__(self) -> Iterator[list[int]]:
        # ``skip`` is read, not consumed: a multi-worker DataLoader iterator calls iter() on
        # its batch sampler twice while it starts; the owner resets ``skip`` afterwards.
        skip = self.skip
        it = iter(self.batch_sampler)
        if skip:
            it = itertools.islice(it, skip, None)
        if self.seed is None:
            return it
        return self._seeded(it, skip, self.seed, self.epoch)

    @staticmethod
    def _seeded(it: Iterator[list[int]], start: int, seed: int, epoch: int) -> Iterator[list[int]]:
        for i, indices in enumerate(it, start):
            batch = SeededBatch(indices)
            batch.seed = batch_seed(seed, epoch, i)
            yield batch

    def __len__(self) -> int:
        return len(self.batch_sampler)


class WorkerSeededDataset(Dataset):
    """Loads a :class:`SeededBatch` under its seed when running inside a DataLoader worker.

    The worker re-seeds ``random``, NumPy and torch with the batch's seed before loading it,
    so a sample's augmentation is the same whichever worker loads it (a resumed epoch starts
    on worker 0).

    Only worker processes are re-seeded: in the main process (``num_workers=0``) samples
    draw from the global generators, which a checkpoint saves and restores.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[Any]) -> list[Any]:
        seed = getattr(indices, "seed", None)
        if seed is not None and get_worker_info() is not None:
            random.seed(seed)
            np.random.seed(seed % 2**32)
            torch.manual_seed(seed)
        inner = getattr(self.dataset, "__getitems__", None)
        if inner is not None:
            return inner(list(indices))  # type: ignore[no-any-return]
        return [self.dataset[i] for i in indices]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (unpickling): avoid recursing
            raise AttributeError(name)
        return getattr(self.dataset, name)


class ResumableLoader:
    """A data loader that knows its epoch and position and can restart from them.

    Iterating yields the remaining batches of the current epoch; ``len()`` is the full
    epoch length. ``state_dict()`` is ``{"epoch", "position", "seed"}`` for a loader used
    on its own; inside a Trainer the checkpoint keeps the position once, in ``progress``,
    and positions the loader from it with :meth:`load_state_dict`.

    The batches come straight from the ``DataLoader`` iterator (no Python frame per batch):
    the position is read from the iterator's count of yielded batches when someone asks, and
    the epoch is closed by a stage chained after the last batch.

    A stream (an ``IterableDataset``) whose loader has state (torchdata's ``StatefulDataLoader``, which
    :func:`make_resumable` builds) continues from :meth:`stream_state` given back by :meth:`load_stream_state`
    (the ``data_state`` checkpoint piece, :class:`~trainwright.data.stream_state.StreamState`); a stream
    without state is read again up to its position. A stream without ``__len__`` is endless: ``len()``
    raises ``TypeError`` and :attr:`length` is None.
    """

    def __init__(self, loader: DataLoader, seed: int = 0, rank: int = 0) -> None:
        self.loader = loader
        self.seed = seed
        self.rank = rank
        self.epoch = 0
        self._position = 0
        self._live: Any = None  # the DataLoader iterator of the epoch in progress
        self._live_start = 0  # the position it started from
        self._batch_sampler = loader.batch_sampler if isinstance(loader.batch_sampler, SkippableBatchSampler) else None
        self._generator = loader.generator
        self._iterable = isinstance(loader.dataset, IterableDataset)
        #: Whether the stream's position is restored from its own state (else it is read again up to it).
        self.stateful = self._iterable and has_state(loader)
        self._pending: Any = None  # a restored stream state, applied by the next iter()

    @property
    def length(self) -> int | None:
        """Batches per pass over the data; None for a stream without ``__len__`` (endless, or of unknown length)."""
        try:
            return len(self.loader)
        except TypeError:
            return None

    @property
    def position(self) -> int:
        """Batches of the current epoch already handed out."""
        if self._live is not None:
            return self._live_start + self._live._num_yielded  # noqa: SLF001 - DataLoader's own count
        return self._position

    @position.setter
    def position(self, value: int) -> None:
        self._live = None
        self._position = value

    @property
    def dataset(self) -> Any:
        """The user's dataset."""
        ds = self.loader.dataset
        return ds.dataset if isinstance(ds, WorkerSeededDataset) else ds

    @property
    def batch_size(self) -> int | None:
        """The batch size, when the loader has a fixed one."""
        bs = getattr(self._batch_sampler, "batch_sampler", None)
        return getattr(bs, "batch_size", self.loader.batch_size)

    def shape(self) -> dict[str, Any]:
        """What a position in an epoch means: ``batch_size``, ``dataset_len``, ``drop_last``, ``num_replicas``,
        ``batches``.

        Saved with the data order in a checkpoint: a resume in the middle of an epoch with
        another shape would skip or repeat samples (see :class:`~trainwright.trainer.state.DataOrderState`).
        """
        batch_sampler = getattr(self._batch_sampler, "batch_sampler", self.loader.batch_sampler)
        sampler = getattr(batch_sampler, "sampler", None)
        dataset = self.dataset
        return {
            "batch_size": self.batch_size,
            "dataset_len": len(dataset) if isinstance(dataset, Sized) else None,
            "drop_last": bool(getattr(batch_sampler, "drop_last", self.loader.drop_last)),
            "num_replicas": int(getattr(sampler, "num_replicas", 1)),
            "batches": self.length,
        }

    def set_seed(self, seed: int) -> None:
        """Use ``seed`` for the data order from now on (a resumed run adopts its checkpoint's seed)."""
        self.seed = seed
        sampler = getattr(getattr(self._batch_sampler, "batch_sampler", None), "sampler", None)
        if isinstance(sampler, EpochSampler):
            sampler.seed = seed

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch (the sampler seed hook calls this)."""
        if epoch != self.epoch:
            self.position = 0
        self.epoch = epoch

    def _sync_epoch(self) -> None:
        sampler = getattr(self._batch_sampler, "batch_sampler", None)
        inner = getattr(sampler, "sampler", None)
        for s in (inner, sampler, getattr(self.loader, "sampler", None)):
            if s is not None and hasattr(s, "set_epoch"):
                s.set_epoch(self.epoch)
                break
        if self._generator is not None:  # the loader iterator's base seed (its workers'): never the global RNG
            self._generator.manual_seed(self.seed * 1_000_003 + self.epoch)
        set_epoch = getattr(self.loader.dataset, "set_epoch", None)
        if self._iterable and callable(set_epoch):  # a stream that orders each pass by its epoch (Hugging Face's)
            set_epoch(self.epoch)
        if self._batch_sampler is not None and isinstance(self.loader.dataset, WorkerSeededDataset):
            # worker seeds differ per rank (each rank loads other samples; augmentations must not repeat)
            self._batch_sampler.seed = self.seed if self.rank == 0 else batch_seed(self.seed, -1, self.rank)
            self._batch_sampler.epoch = self.epoch

    def __iter__(self) -> Iterator[Any]:
        self.position = self.position  # an earlier pass left unfinished: keep where it stopped
        self._sync_epoch()
        start = self._position
        pending, self._pending = self._pending, None
        length = self.length
        if length is not None and start >= length:
            # Saved after the epoch's last batch but before the epoch was closed: the
            # epoch is complete, so this pass is empty and the next one starts a new epoch.
            self.position = 0
            self.epoch += 1
            return iter(())
        if self._batch_sampler is not None:
            self._batch_sampler.skip = start
            try:
                it = iter(self.loader)
            finally:
                self._batch_sampler.skip = 0
            if hasattr(it, "_num_yielded"):
                self._live, self._live_start = it, start
                return itertools.chain(it, self._close_epoch(it))
            return self._counting(it)
        if start and pending is not None:
            self._warn_unless_dataset_has_state(start)
            self.loader.load_state_dict(pending)  # type: ignore[attr-defined]  # a stateful loader (has_state)
            return self._counting(iter(self.loader))
        it = iter(self.loader)
        if start:
            warnings.warn(
                f"Resuming an iterable data loader by consuming {start} batches (a stream without a saved state is "
                "read again up to its position); to restore it instead, give the dataset state_dict() / "
                "load_state_dict() (Hugging Face streaming datasets have them) and build the loader with "
                "train_dataloader=dict(..., stateful=True) (the default for a dict) or pass a torchdata "
                "StatefulDataLoader",
                stacklevel=2,
            )
            for _ in itertools.islice(it, start):
                pass
        return self._counting(it)

    def _warn_unless_dataset_has_state(self, start: int) -> None:
        """A stateful loader over a dataset without state fast-forwards its workers: say so, and what avoids it."""
        if not has_state(self.loader.dataset):
            warnings.warn(
                f"Resuming the stream by reading again the samples of {start} batches: its dataset "
                f"{type(self.loader.dataset).__name__} has no state_dict() / load_state_dict(), so the loader's saved "
                "state holds only counts. Give the dataset state_dict() / load_state_dict() (its position) to restore "
                "it instead",
                stacklevel=3,
            )

    def _close_epoch(self, it: Any) -> Iterator[Any]:
        """Chained after the epoch's batches: runs once they are exhausted, yields nothing."""
        if self._live is it:
            self.position = 0
            self.epoch += 1
        yield from ()

    def _counting(self, it: Iterator[Any]) -> Iterator[Any]:
        """The general path (iterators without a yielded-batch count): count as we go."""
        for batch in it:
            self._position += 1
            yield batch
        self._position = 0
        self.epoch += 1

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """Epoch, position inside it, and seed."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def stream_state(self) -> dict[str, Any] | None:
        """The stream's own position (its ``StatefulDataLoader``'s state: every worker's), or None where none is
        needed: not a stateful stream, or at the start of a pass."""
        if not self.stateful or self.position == 0:
            return None
        if self._pending is not None:  # restored, not iterated yet
            return self._pending  # type: ignore[no-any-return]
        return self.loader.state_dict()  # type: ignore[attr-defined,no-any-return]

    def load_stream_state(self, state: Mapping[str, Any] | None) -> None:
        """Continue the stream from ``state`` (:meth:`stream_state`'s) at the next ``iter()``, at the position
        :meth:`load_state_dict` set; None: read it again up to that position."""
        self._pending = dict(state) if state is not None and self.stateful else None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restart at ``state``'s epoch and position (warns when its ``seed`` differs from this loader's)."""
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        if int(state.get("seed", self.seed)) != self.seed:
            warnings.warn(
                f"Data order seed changed from {state['seed']} to {self.seed} on resume; the data order will differ "
                "from the original run",
                stacklevel=2,
            )


_LOADER_KEYS = {
    "dataset",
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
    "stateful",
}


def make_dataloader(cfg: DataLoader | Mapping[str, Any], name: str = "dataloader") -> DataLoader:
    """A ``DataLoader`` from itself or from a dict of its arguments (``dataset`` may be a ``dict(type=...)``).

    mmengine's ``sampler=dict(type='DefaultSampler', shuffle=...)`` and ``collate_fn=dict(type=...)``
    are translated (:mod:`trainwright.data.loader_args`); any other sampler dict is refused by name.
    ``stateful=True`` builds torchdata's ``StatefulDataLoader`` over an ``IterableDataset``.
    """
    if isinstance(cfg, Mapping):
        check_keys(name, cfg, _LOADER_KEYS, hint=f"Use DataLoader arguments: {sorted(_LOADER_KEYS)}")
        stateful = cfg.get("stateful")
        if stateful is not None and not isinstance(stateful, bool):
            raise ConfigError(f"{name} stateful must be True or False, got {stateful!r}")
        cfg = {k: v for k, v in cfg.items() if k != "stateful"}
        if "dataset" not in cfg:
            raise KeyError(
                f"{name} dict needs a 'dataset' (a Dataset or dict(type=...)), e.g. dict(dataset=ds, batch_size=32, "
                "shuffle=True)"
            )
        args = dataloader_arguments(
            cfg, name
        )  # mmengine's sampler / collate_fn dicts: never handed to torch as they are
        args["dataset"] = DATASETS.build(args["dataset"])
        stream = stateful and isinstance(args["dataset"], IterableDataset)
        cfg = new_stateful_loader(**args) if stream else DataLoader(**args)
    if not isinstance(cfg, DataLoader):
        raise TypeError(
            f"{name} must be a torch DataLoader or a dict of DataLoader arguments, got {type(cfg).__name__}"
        )
    if isinstance(cfg.sampler, Mapping):  # torch iterates a dict: its keys would reach the dataset as indices
        raise ConfigError(
            f"{name} is a DataLoader built with sampler={dict(cfg.sampler)!r}, whose keys torch hands the dataset as "
            "indices. Give the loader "
            "as a dict, dict(dataset=..., batch_size=..., sampler=dict(type='DefaultSampler', shuffle=True)), which "
            "trainwright translates, "
            "or build the DataLoader with shuffle=True/False or a sampler object"
        )
    return cfg


def build_dataloader(
    cfg: DataLoader | Mapping[str, Any] | ResumableLoader,
    seed: int = 0,
    name: str = "train_dataloader",
    num_replicas: int = 1,
    rank: int = 0,
) -> ResumableLoader:
    """Turn a ``DataLoader`` or a dict of ``DataLoader`` arguments into a :class:`ResumableLoader` (of this rank's
    shard).

    A stream (an ``IterableDataset``) under several processes is split so each rank reads its own part
    (:func:`~trainwright.data.split.split_loader`); ``dict(..., split_stream=False)`` keeps it as it is.

    A stream is loaded by torchdata's ``StatefulDataLoader``, whose state the checkpoint keeps: when the dict says
    ``stateful=True`` or leaves it out, when one is passed in, or when a ``DataLoader`` passed in reads a dataset with
    ``state_dict()`` / ``load_state_dict()``. ``stateful=False`` keeps a plain ``DataLoader`` (a resume reads the
    stream again up to its position).
    """
    if isinstance(cfg, ResumableLoader):
        return cfg
    stateful = bool(cfg.get("stateful", True)) if isinstance(cfg, Mapping) else None
    split = True
    if isinstance(cfg, Mapping) and "split_stream" in cfg:
        cfg = dict(cfg)
        split = bool(cfg.pop("split_stream"))
    loader = make_dataloader(cfg, name)
    if num_replicas > 1 and isinstance(loader.dataset, IterableDataset):
        if split:
            loader = split_loader(loader, rank, num_replicas, name)
        else:
            warn_unsplit(name, num_replicas)
    return ResumableLoader(make_resumable(loader, seed, num_replicas, rank, name, stateful=stateful), seed, rank)


def _custom(batch_sampler: Any, num_replicas: int, name: str) -> Any:
    """A user's own (batch) sampler, kept as it is; under several processes it must shard itself."""
    if num_replicas > 1 and not hasattr(getattr(batch_sampler, "sampler", batch_sampler), "num_replicas"):
        warnings.warn(
            f"The {name} has its own sampler ({type(batch_sampler).__name__}), which trainwright keeps as it is: under "
            f"{num_replicas} processes every rank reads what it yields. Shard it yourself (e.g. DistributedSampler), "
            "or use "
            "shuffle=True/False and let trainwright shard the data.",
            stacklevel=3,
        )
    return batch_sampler


def make_resumable(
    loader: DataLoader,
    seed: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
    name: str = "train_dataloader",
    stateful: bool | None = None,
) -> DataLoader:
    """Rebuild ``loader`` with a seed-determined, skippable sampler (of ``rank``'s shard); same data, batching and
    workers.

    The rebuilt loader keeps the dataset, batch size, sampler, collate function and worker
    settings.

    Under several processes, worker seeds include the rank (see :func:`batch_seed`). The
    trainer also shards evaluation loaders with it: each rank evaluates its padded shard
    (``DistributedSampler`` semantics) and the metrics drop the padding when they gather
    (see :mod:`trainwright.evaluation.collect`). ``name`` is the loader's name in warnings.

    A loader over an ``IterableDataset`` is built again with a generator of its own (the workers' base seed, set per
    epoch by :class:`ResumableLoader`): a ``StatefulDataLoader`` when ``stateful``, and when ``stateful`` is None
    (not said) if it is one already or its dataset has ``state_dict()`` / ``load_state_dict()``.
    """
    if isinstance(loader.dataset, IterableDataset):
        if stateful is None:
            stateful = has_state(loader) or has_state(loader.dataset)
        generator = torch.Generator()
        generator.manual_seed(seed)
        return rebuild_stream_loader(loader, generator, stateful)
    if loader.batch_sampler is None:
        return loader
    bs = loader.batch_sampler
    batchers, randoms = stock_samplers(loader)  # a StatefulDataLoader's own versions of torch's samplers too
    if isinstance(bs, BatchSampler) and type(bs) in batchers and isinstance(bs.sampler, (*randoms, SequentialSampler)):
        s: Any = bs.sampler
        shuffle = isinstance(s, randoms)
        if shuffle and (s.replacement or s._num_samples is not None):  # noqa: SLF001
            inner: Any = _custom(bs, num_replicas, name)
        else:
            inner = BatchSampler(
                EpochSampler(
                    len(cast(Sized, loader.dataset)),
                    shuffle=shuffle,
                    seed=seed,
                    num_replicas=num_replicas,
                    rank=rank,
                ),
                bs.batch_size,
                bs.drop_last,
            )
    else:
        inner = _custom(bs, num_replicas, name)
    generator = torch.Generator()
    generator.manual_seed(seed)
    dataset = WorkerSeededDataset(loader.dataset) if loader.num_workers > 0 else loader.dataset
    return DataLoader(dataset, batch_sampler=SkippableBatchSampler(inner), **carried_arguments(loader, generator))
