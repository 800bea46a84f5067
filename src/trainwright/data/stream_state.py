"""A stream's own position: saved with the checkpoint and restored, so a resumed stream is not read again.

A loader over an ``IterableDataset`` is rebuilt as torchdata's ``StatefulDataLoader`` (imported when used), which
keeps the position of every loader worker (each worker's dataset ``state_dict()``); :class:`StreamState` is the
checkpoint piece (``data_state``) that saves it and hands it back on resume.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from trainwright.data.loader_args import carried_arguments

if TYPE_CHECKING:
    from trainwright.data.loader import ResumableLoader


def has_state(obj: Any) -> bool:
    """Whether ``obj`` saves and restores its position: callable ``state_dict()`` and ``load_state_dict(state)``."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def batches_per_pass(loader: Any) -> int | None:
    """``len(loader)``: the batches of one pass over the data; None for a stream without ``__len__`` (endless, or of
    unknown length)."""
    try:
        return len(loader)
    except TypeError:
        return None


def stateful_loader_class() -> type[DataLoader]:
    """torchdata's ``StatefulDataLoader`` (a ``DataLoader`` whose ``state_dict()`` holds each worker's position)."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as e:  # pragma: no cover - torchdata is a dependency
        raise ImportError(
            "A stateful train_dataloader needs torchdata's StatefulDataLoader: pip install torchdata (pinned in "
            "constraints.txt), or pass train_dataloader=dict(..., stateful=False) to resume the stream by reading it "
            "again"
        ) from e
    return StatefulDataLoader


def stock_samplers(loader: DataLoader) -> tuple[tuple[type, ...], tuple[type, ...]]:
    """``(batch sampler classes, random sampler classes)`` that order a map-style ``loader`` as torch's stock
    ``BatchSampler`` over a ``RandomSampler`` / ``SequentialSampler`` does: torch's, and torchdata's stateful versions
    of them when ``loader`` is a ``StatefulDataLoader`` (which builds those in their place)."""
    from torch.utils.data import BatchSampler, RandomSampler

    if not has_state(loader):
        return (BatchSampler,), (RandomSampler,)
    from torchdata.stateful_dataloader import sampler as stateful

    return (BatchSampler, stateful.BatchSampler), (RandomSampler, stateful.RandomSampler)


def rebuild_stream_loader(loader: DataLoader, generator: torch.Generator, stateful: bool) -> DataLoader:
    """``loader`` (over an ``IterableDataset``) built again with ``generator``: a ``StatefulDataLoader`` if
    ``stateful``, else a ``DataLoader``; same dataset, batching, collate function and worker settings.

    The generator gives the loader iterator its base seed (the workers' seeds): the global RNG is never drawn from.
    """
    kwargs = dict(batch_size=loader.batch_size, drop_last=loader.drop_last, **carried_arguments(loader, generator))
    if not stateful:
        return DataLoader(loader.dataset, **kwargs)
    return new_stateful_loader(
        loader.dataset, snapshot_every_n_steps=getattr(loader, "snapshot_every_n_steps", 1), **kwargs
    )


def new_stateful_loader(dataset: Any, **kwargs: Any) -> DataLoader:
    """``StatefulDataLoader(dataset, **kwargs)``, without the deprecation warning torchdata 0.11 gives under torch
    2.13 when one is built (its own call of ``torch.set_vital``, nothing the user can change)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
        return stateful_loader_class()(dataset, **kwargs)


class StreamState:
    """Checkpoint piece ``data_state``: the train stream's own position, restored instead of read again.

    ``state_dict()`` is ``{"stream": ...}``: the state of the train loader's ``StatefulDataLoader`` (every worker's
    dataset state; tensors and plain containers, so the checkpoint loads with ``weights_only=True``), or None where
    nothing needs it (a map-style dataset, whose position is its sampler's, from ``progress``; a stream at the start of
    a pass; a stream without state, read again on resume). ``load_state_dict`` hands it to the loader, whose next
    ``iter()`` continues from it.

    Under several processes each rank reads its own part of the stream: a save gathers every rank's state
    (``"per_rank"``, a collective, as the RNG piece's) and each rank restores its own; a checkpoint of another number
    of processes restores none (each rank reads its part again up to the position, with a warning).

    Args:
        loader: The train loader.
        gather: Every rank's object in rank order (``Strategy.gather_object``); needed when ``world_size > 1``.
        rank: This process's rank.
        world_size: How many processes train.
    """

    def __init__(
        self,
        loader: ResumableLoader,
        gather: Callable[[Any], list[Any]] | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if world_size > 1 and gather is None:
            raise ValueError("StreamState under several processes needs gather (Strategy.gather_object)")
        self.loader = loader
        self.gather = gather
        self.rank = rank
        self.world_size = world_size

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        own = self.loader.stream_state()
        if self.gather is None or self.world_size == 1 or not self.loader.stateful:  # the same on every rank
            return {"stream": own}
        return {"stream": own, "per_rank": list(self.gather(own))}

    def check_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        if not isinstance(state, Mapping) or "stream" not in state:
            raise ValueError(
                f"the data_state entry is {type(state).__name__}, not a dict with a 'stream' entry; resume from a "
                "checkpoint written by trainwright"
            )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        per_rank = state.get("per_rank")
        world, rank = self.world_size, self.rank
        if per_rank is None and world == 1:
            self.loader.load_stream_state(state.get("stream"))
        elif per_rank is not None and len(per_rank) == world:
            self.loader.load_stream_state(per_rank[rank])
        else:
            saved = 1 if per_rank is None else len(per_rank)
            if self.loader.stateful and any(s is not None for s in (per_rank or [state.get("stream")])):
                warnings.warn(
                    f"The checkpoint holds the stream positions of {saved} process(es), this run has {world}: each "
                    "rank reads its part of the stream again up to the checkpoint's position instead. Resume with "
                    f"{saved} process(es) to restore them",
                    stacklevel=2,
                )
            self.loader.load_stream_state(None)
