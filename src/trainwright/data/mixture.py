"""Mixture: samples drawn from several datasets (map-style and streams) with given weights, resumable exactly.

The draws come from a counter-based generator of ``(seed, reader, draw)``, so the sampling state is one count; each
source keeps its own position (a map-style source: its pass, whose permutation comes from the seed, and an index in
it; a stream: its pass, the items read and its own ``state_dict()`` when it has one).
"""

from __future__ import annotations

import copy
import itertools
import warnings
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset

from trainwright.data.split import is_hf_stream, worker_slot
from trainwright.registry import DATASETS

__all__ = ["Mixture"]

_M64 = (1 << 64) - 1
_END = object()


def _uniform(seed: int, slot: int, n: int) -> float:
    """The ``n``-th draw in ``[0, 1)`` of reader ``slot`` (splitmix64 of the three)."""
    x = (seed * 0x9E3779B97F4A7C15 + (slot + 1) * 0xD1B54A32D192ED03 + n * 0x8CB92BA72F3D8DD7) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return ((x ^ (x >> 31)) >> 11) / float(1 << 53)


def _is_map_style(source: Any) -> bool:
    return not isinstance(source, IterableDataset) and hasattr(source, "__getitem__") and hasattr(source, "__len__")


@DATASETS.register_module()
class Mixture(IterableDataset):
    """An endless stream of samples drawn from ``sources`` with ``weights``, from its own seeded generator.

    Each draw picks a source with probability ``weight / sum(weights)`` and takes that source's next sample: a
    map-style source (``__getitem__`` and ``__len__``) goes through a permutation per pass (fixed by ``seed``, the
    source's index and the pass; in order with ``shuffle=False``) and starts a new pass when it is used up; a stream
    (any iterable) is read in order and started again (``set_epoch(pass)`` when it has one) when it ends.

    :meth:`state_dict` holds the draws made and every source's position (plain ints, lists and dicts, and a stream's
    own ``state_dict()``), so :meth:`load_state_dict` goes on exactly where it was saved. Resumed with other weights,
    the sources go on from their saved positions, drawn with the new weights (a warning names both). A stream without
    ``state_dict()`` is resumed by reading past the items it had given.

    Under DataLoader workers and several processes each reader (rank x worker) draws its own share with its own
    generator: a map-style source gives each reader every ``readers``-th position of its permutation, a stream every
    ``readers``-th item (a Hugging Face ``IterableDataset`` is split by node with ``split_dataset_by_node`` and among
    workers by itself). With torchdata's ``StatefulDataLoader`` each worker's state is saved and restored.

    Args:
        sources: The datasets, a sequence or a mapping of names to datasets (``dict(type=...)`` configs are built).
        weights: One non-negative weight per source (not all zero); they need not sum to 1.
        seed: Seed of the draws and of the map-style sources' permutations.
        shuffle: Permute the map-style sources (else each pass is in index order).
    """

    #: It never ends (its sources start again): under several processes no rank waits for another's end.
    endless = True

    def __init__(
        self,
        sources: Sequence[Any] | Mapping[str, Any],
        weights: Sequence[float],
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if isinstance(sources, Mapping):
            names, items = [str(k) for k in sources], list(sources.values())
        else:
            items = list(sources)
            names = [str(i) for i in range(len(items))]
        if not items:
            raise ValueError("Mixture needs at least one source, e.g. Mixture([ds_a, ds_b], weights=[0.7, 0.3])")
        self.names = names
        self.sources = [DATASETS.build(s) if isinstance(s, Mapping) else s for s in items]
        for name, s in zip(names, self.sources):
            if not _is_map_style(s) and not hasattr(s, "__iter__"):
                raise TypeError(
                    f"Mixture source {name!r} ({type(s).__name__}) is neither a map-style dataset (__getitem__ and "
                    "__len__) nor an iterable"
                )
        self.weights = self._checked(weights)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.rank, self.world = 0, 1
        self._draws = 0
        self._pos: list[dict[str, Any]] = [self._start_position(s) for s in self.sources]
        self._opened: list[bool] = [False] * len(self.sources)  # a stream read in this process (its state is live)
        self._perm: tuple[int, int, list[int]] | None = None  # (source, pass, permutation) of the last map-style draw

    def _checked(self, weights: Sequence[float]) -> list[float]:
        w = [float(x) for x in weights]
        if len(w) != len(self.sources):
            raise ValueError(
                f"Mixture has {len(self.sources)} sources but {len(w)} weights: give one weight per source"
            )
        if any(not x >= 0 for x in w) or sum(w) <= 0:
            raise ValueError(f"Mixture weights must be >= 0 and not all 0, got {w}")
        return w

    @staticmethod
    def _start_position(source: Any) -> dict[str, Any]:
        if _is_map_style(source):
            return {"pass": 0, "index": 0}
        return {"pass": 0, "taken": 0, "state": None}

    @property
    def split_note(self) -> str:
        """How the mixture is split among readers, in words (logged when training starts)."""
        return (
            f"Mixture of {len(self.sources)} sources, each rank x loader worker drawing its own share (rank "
            f"{self.rank} of {self.world})"
        )

    def split_by_node(self, rank: int, world: int) -> Mixture:
        """This mixture for rank ``rank`` of ``world`` processes: its own draws and its share of every source."""
        if not 0 <= rank < world:
            raise ValueError(f"Mixture.split_by_node rank must be in [0, world), got rank={rank}, world={world}")
        out = copy.copy(self)
        out.rank, out.world = rank, world
        out._pos = copy.deepcopy(self._pos)
        out._opened = list(self._opened)
        out.sources = list(self.sources)
        for k, s in enumerate(self.sources):
            if is_hf_stream(s):
                from datasets.distributed import split_dataset_by_node

                out.sources[k] = split_dataset_by_node(s, rank=rank, world_size=world)
        return out

    # -- drawing ---------------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        slot, slots = worker_slot(self.rank, self.world)
        self._pos = self.state_dict()["sources"]  # streams read by an earlier pass: their live state
        self._opened = [False] * len(self.sources)
        cumulative = list(itertools.accumulate(self.weights))
        total = cumulative[-1]
        streams: dict[int, Iterator[Any]] = {}
        while True:
            k = min(bisect_right(cumulative, _uniform(self.seed, slot, self._draws) * total), len(cumulative) - 1)
            self._draws += 1
            if "index" in self._pos[k]:
                yield self._take_indexed(k, slot, slots)
            else:
                yield self._take_streamed(k, slot, slots, streams)

    def _take_indexed(self, k: int, slot: int, slots: int) -> Any:
        source, pos = self.sources[k], self._pos[k]
        n = len(source)
        if slot >= n:
            raise ValueError(
                f"Mixture source {self.names[k]!r} has {n} samples, fewer than its {slots} readers (processes x loader "
                "workers): give it more samples or use fewer workers"
            )
        j = slot + pos["index"] * slots
        if j >= n:
            pos["pass"] += 1
            pos["index"], j = 0, slot
        pos["index"] += 1
        return source[self._permutation(k, pos["pass"], n)[j]]

    def _permutation(self, k: int, pass_: int, n: int) -> list[int]:
        if self._perm is None or self._perm[:2] != (k, pass_):
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed((self.seed * 1_000_003 + k * 10_007 + pass_) & ((1 << 63) - 1))
                order = torch.randperm(n, generator=g).tolist()
            else:
                order = list(range(n))
            self._perm = (k, pass_, order)
        return self._perm[2]

    def _take_streamed(self, k: int, slot: int, slots: int, streams: dict[int, Iterator[Any]]) -> Any:
        for _ in range(2):
            it = streams.get(k)
            if it is None:
                it = streams[k] = self._read(k, slot, slots)
            item = next(it, _END)
            if item is not _END:
                return item
            pos = self._pos[k]  # the stream ended: its next pass
            pos.update({"pass": pos["pass"] + 1, "taken": 0, "state": None})
            self._opened[k] = False
            del streams[k]
        raise RuntimeError(
            f"Mixture source {self.names[k]!r} yields no item for reader {slot} of {slots} (processes x loader "
            "workers): a Hugging Face stream needs at least as many shards (files) as readers; give it more shards or "
            "use fewer workers"
        )

    def _read(self, k: int, slot: int, slots: int) -> Iterator[Any]:
        """Stream ``k`` from its saved position, this reader's items only."""
        source, pos = self.sources[k], self._pos[k]
        set_epoch = getattr(source, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(pos["pass"])
        start, state = pos["taken"], pos["state"]
        load = getattr(source, "load_state_dict", None)
        if state is not None and callable(load):
            load(state)
            items: Iterator[Any] = iter(source)
        else:
            if start:
                warnings.warn(
                    f"Mixture source {self.names[k]!r} ({type(source).__name__}) has no state_dict(): resuming reads "
                    f"past the {start} items it had given. Give it state_dict() / load_state_dict() to go on without "
                    "reading them",
                    stacklevel=4,
                )
            items = itertools.islice(iter(source), start, None)
        own_split = is_hf_stream(source)  # splits itself among loader workers
        self._opened[k] = True
        for i, item in enumerate(items, start):
            pos["taken"] = i + 1
            if own_split or i % slots == slot:
                yield item

    # -- state -----------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """``{"seed", "weights", "draws", "sources": [position per source]}``: plain numbers, lists and dicts."""
        sources = []
        for k, pos in enumerate(self._pos):
            entry = dict(pos)
            own = getattr(self.sources[k], "state_dict", None)
            if "taken" in pos and self._opened[k] and callable(own):
                entry["state"] = own()
            sources.append(entry)
        return {"seed": self.seed, "weights": list(self.weights), "draws": self._draws, "sources": sources}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from ``state``: the same draws and source positions (other weights or seed: a warning, and the
        sources go on from their saved positions).

        Raises:
            ValueError: ``state`` has another number or kind of sources.
        """
        saved = list(state["sources"])
        kinds = ["index" if "index" in p else "taken" for p in saved]
        mine = ["index" if "index" in p else "taken" for p in self._pos]
        if kinds != mine:
            raise ValueError(
                f"Mixture state has {len(saved)} sources ({kinds}) but this mixture has {len(mine)} ({mine}): resume "
                "with the same sources, in the same order"
            )
        old = [float(x) for x in state["weights"]]
        if old != self.weights:
            warnings.warn(
                f"Mixture weights changed at resume from {old} to {self.weights}: the sources go on from their saved "
                "positions, drawn with the new weights",
                stacklevel=2,
            )
        if int(state["seed"]) != self.seed:
            warnings.warn(
                f"Mixture seed changed at resume from {state['seed']} to {self.seed}: the draws from here on differ "
                "from the original run's",
                stacklevel=2,
            )
        self._draws = int(state["draws"])
        self._pos = [dict(p) for p in saved]
        self._opened = [False] * len(saved)
