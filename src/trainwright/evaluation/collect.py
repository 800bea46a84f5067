"""Gather metric results from every rank and put them back in dataset order.

A ``DistributedSampler`` pads the index list to a multiple of the world size and deals it
out round-robin: rank ``r`` sees dataset positions ``r, r + W, r + 2W, ...``. So the ``k``-th
result of rank ``r`` belongs at position ``k * W + r``; reading the ranks' results in that
order and cutting at the dataset size restores the order the sampler drew and drops the
padding duplicates. This only works when results can be counted per sample, which is why
a metric declares its layout (see :class:`~trainwright.evaluation.Metric`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from trainwright import dist

Device = str | torch.device


class Collectives(Protocol):
    """What evaluation needs of a process group: the Trainer's strategy is one (evaluation follows its group)."""

    @property
    def world_size(self) -> int: ...  # noqa: D102

    @property
    def is_main_process(self) -> bool: ...  # noqa: D102

    def gather_object(self, obj: Any) -> list[Any]: ...  # noqa: D102

    def broadcast_object(self, obj: Any, src: int = 0) -> Any: ...  # noqa: D102


class DefaultGroup:
    """The process's default group (``torch.distributed``'s, or one process): a metric evaluated outside a Trainer."""

    @property
    def world_size(self) -> int:  # noqa: D102
        return dist.get_world_size()

    @property
    def is_main_process(self) -> bool:  # noqa: D102
        return dist.is_main_process()

    def gather_object(self, obj: Any) -> list[Any]:  # noqa: D102
        return dist.all_gather_object(obj)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:  # noqa: D102
        return dist.broadcast_object(obj, src=src)


#: The collectives of a metric no Trainer has placed in a strategy's group.
DEFAULT_GROUP = DefaultGroup()


def resolve_device(device: Device) -> torch.device:
    """Turn ``"cpu"``, ``"gpu"`` / ``"cuda"`` (the current CUDA device) or a device into a ``torch.device``."""
    if isinstance(device, str) and device in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"collect_device={device!r} but CUDA is not available; use collect_device='cpu'")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)


def to_device(obj: Any, device: torch.device) -> Any:
    """Move every tensor inside nested dicts / lists / tuples to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return _rebuild(obj, [to_device(v, device) for v in obj])
    return obj


def _rebuild(seq: list[Any] | tuple[Any, ...], items: list[Any]) -> Any:
    """A sequence of ``seq``'s type holding ``items`` (namedtuples take positional fields)."""
    if hasattr(seq, "_fields"):
        return type(seq)(*items)
    return type(seq)(items)


def _cat(entries: Sequence[Any], where: str) -> Any:
    """Concatenate batch entries (tensors, or dicts / tuples of tensors) along dim 0."""
    first = entries[0]
    if isinstance(first, torch.Tensor):
        if any(e.dim() == 0 for e in entries):
            raise ValueError(
                f"{where} holds a 0-dim tensor, but a metric with batched_results=True must store one row per "
                f"sample (dim 0 = samples of the batch) so that padding added by a DistributedSampler can be cut "
                f"off; store e.g. a per-sample bool tensor instead of a per-batch count."
            )
        return torch.cat(list(entries))
    if isinstance(first, Mapping):
        return {k: _cat([e[k] for e in entries], f"{where}[{k!r}]") for k in first}
    if isinstance(first, (list, tuple)):
        return _rebuild(first, [_cat([e[i] for e in entries], f"{where}[{i}]") for i in range(len(first))])
    raise TypeError(
        f"A metric with batched_results=True must store tensors (or dicts / tuples of tensors) whose dim 0 "
        f"indexes the samples of the batch; {where} is a {type(first).__name__}. Store tensors, or set "
        f"batched_results=False and append one entry per sample."
    )


def _num_samples(merged: Any) -> int:
    if isinstance(merged, torch.Tensor):
        return merged.shape[0]
    if isinstance(merged, Mapping):
        merged = list(merged.values())
    sizes = {_num_samples(v) for v in merged}
    if len(sizes) != 1:
        raise ValueError(
            f"Batched metric results disagree on the number of samples per batch: {sorted(sizes)}; every tensor of a "
            "batch entry needs the batch size as dim 0"
        )
    return sizes.pop()


def _take(merged: Any, index: torch.Tensor) -> Any:
    if isinstance(merged, torch.Tensor):
        return merged.index_select(0, index.to(merged.device))
    if isinstance(merged, Mapping):
        return {k: _take(v, index) for k, v in merged.items()}
    return _rebuild(merged, [_take(v, index) for v in merged])


def merge_rank_results(parts: Sequence[Sequence[Any]], size: int, *, batched: bool = False) -> list[Any]:
    """Put per-rank results back in sampler order and keep the first ``size`` samples.

    Args:
        parts: One list per rank, in rank order: that rank's ``Metric.results`` (for
            ``batched=True``, already concatenated into at most one entry per rank).
        size: Number of samples in the dataset; the rest are the sampler's padding.
        batched: Whether the entries are batches (dim 0 indexes samples) instead of samples.

    Returns:
        For per-sample results, the list of samples in order. For batched results, a list
        holding one batch with exactly ``min(size, total)`` samples (empty if no samples).
    """
    world = len(parts)
    if not batched:
        ordered: list[Any] = []
        longest = max((len(p) for p in parts), default=0)
        for k in range(longest):
            ordered.extend(p[k] for p in parts if k < len(p))
        return ordered[:size]
    merged_parts = [p[0] for p in parts if len(p) > 0]
    if not merged_parts:
        return []
    positions = []
    for rank, part in enumerate(parts):
        if len(part) > 0:
            positions.append(torch.arange(_num_samples(part[0])) * world + rank)
    order = torch.argsort(torch.cat(positions))[:size]
    return [_take(_cat(merged_parts, "results"), order)]


def collect_results(
    results: list[Any],
    size: int,
    *,
    batched: bool = False,
    device: Device = "cpu",
    collectives: Collectives = DEFAULT_GROUP,
) -> list[Any]:
    """Gather ``results`` from every rank, restore dataset order, drop padding, place on ``device``.

    Objects travel between ranks as CPU pickles (so any rank can unpickle them, across
    nodes too); tensors are then moved to ``device``. Every rank receives the same list.

    Args:
        results: This rank's ``Metric.results``.
        size: Number of samples in the whole dataset.
        batched: See :func:`merge_rank_results`.
        device: Where the returned tensors live (``"cpu"``, ``"gpu"``, a ``torch.device``).
        collectives: The process group to gather over (the Trainer's strategy; default: the process's default group).
    """
    if size < 0:
        raise ValueError(f"size must be the number of samples in the dataset (>= 0), got {size}")
    target = resolve_device(device)
    cpu = torch.device("cpu")
    local: list[Any] = [_cat(results, "results[0]")] if batched and results else list(results)
    local = to_device(local, cpu)
    parts = collectives.gather_object(local) if collectives.world_size > 1 else [local]
    return to_device(merge_rank_results(parts, size, batched=batched), target)


__all__ = ["Collectives", "DEFAULT_GROUP", "collect_results", "merge_rank_results", "resolve_device", "to_device"]
