"""Collectives over many tensors at once: packed into flat buckets of one dtype, one collective per bucket.

What a strategy uses when it synchronises gradients or buffers itself (not through DDP's
reducer): averaging the gradients of a model's parameters one tensor at a time would make one
collective per parameter. The result is bitwise the same on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist

#: Largest bucket, in bytes (DDP's default ``bucket_cap_mb``).
BUCKET_BYTES = 25 * 1024 * 1024


def _buckets(tensors: Sequence[torch.Tensor], cap: int) -> Iterator[list[torch.Tensor]]:
    """``tensors`` grouped by (device, dtype), each group cut into runs of at most ``cap`` bytes (a larger tensor
    alone)."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t.detach())  # the same storage, written outside autograd
    for group in groups.values():
        bucket: list[torch.Tensor] = []
        size = 0
        for t in group:
            nbytes = t.numel() * t.element_size()
            if bucket and size + nbytes > cap:
                yield bucket
                bucket, size = [], 0
            bucket.append(t)
            size += nbytes
        if bucket:
            yield bucket


def _through_flat(bucket: list[torch.Tensor], collective: Callable[[torch.Tensor], object]) -> None:
    """Run ``collective(flat)`` on the bucket packed into one tensor, then copy the result back into each tensor."""
    if len(bucket) == 1 and bucket[0].is_contiguous():
        collective(bucket[0])
        return
    flat = torch.cat([t.reshape(-1) for t in bucket])
    collective(flat)
    for t, part in zip(bucket, flat.split([t.numel() for t in bucket])):
        t.copy_(part.view_as(t))


def all_reduce_mean_(tensors: Sequence[torch.Tensor], world_size: int, cap: int = BUCKET_BYTES) -> None:
    """Replace each tensor by its mean over the ranks, in place (every rank passes the same shapes in the same order).

    Raises:
        ValueError: A tensor is sparse (its values cannot be packed into a dense bucket).
    """
    sparse = [i for i, t in enumerate(tensors) if t.is_sparse]
    if sparse:
        raise ValueError(
            f"all_reduce_mean_: tensors {sparse} are sparse; averaging sparse gradients over processes is not "
            "supported here: use dense embeddings (sparse=False)"
        )

    def reduce(flat: torch.Tensor) -> None:
        dist.all_reduce(flat)
        flat.div_(world_size)

    for bucket in _buckets(tensors, cap):
        _through_flat(bucket, reduce)


def broadcast_(tensors: Sequence[torch.Tensor], src: int = 0, cap: int = BUCKET_BYTES) -> None:
    """Overwrite each tensor with rank ``src``'s, in place (every rank passes the same shapes in the same order)."""
    for bucket in _buckets(tensors, cap):
        _through_flat(bucket, lambda flat: dist.broadcast(flat, src=src))


def count_over_ranks(flags: Sequence[bool], device: torch.device) -> list[int]:
    """For each flag, on how many ranks it is true: one all-reduce of a small integer tensor, read on the host."""
    if not flags:
        return []
    counts = torch.tensor(flags, dtype=torch.int32, device=device)
    dist.all_reduce(counts)
    return [int(n) for n in counts.tolist()]
