"""Tensors that may be sharded (``DTensor``: FSDP2 and tensor-parallel parameters): the local shard, a whole tensor
loaded into a shard.

Elementwise work on a model's weights (averages, copies) runs on each process's local shards:
no communication, and the shards together are the result for the whole tensor. A sharded
checkpoint writes such DTensors with the model's shards (DCP) and reads each back sharded as
the model's tensor of the same name, else whole; :func:`load_into` takes either.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def is_sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a ``torch.distributed.tensor.DTensor``."""
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of ``t`` (a view: in-place changes reach ``t``); ``t`` itself when it is not sharded."""
    return t.to_local() if is_sharded(t) else t  # type: ignore[attr-defined, no-any-return]


def locals_of(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`local` of each tensor (for the ``torch._foreach_*`` kernels, which take no DTensors)."""
    return [local(t) for t in tensors]


def load_into(target: torch.Tensor, saved: torch.Tensor) -> None:
    """Copy ``saved`` into ``target``; a whole tensor into a sharded one goes to this process's shard of it (no
    communication).

    A sharded ``saved`` laid out as ``target`` is copied shard to shard; laid out otherwise, it is
    gathered first (a collective: every process loads the same pieces).
    """
    if is_sharded(saved):
        if is_sharded(target) and (saved.device_mesh, saved.placements) == (target.device_mesh, target.placements):  # type: ignore[attr-defined]
            with torch.no_grad():
                local(target).copy_(local(saved))
            return
        saved = saved.full_tensor()  # type: ignore[attr-defined]
    if is_sharded(target):
        from torch.distributed.tensor import distribute_tensor

        mesh, placements = target.device_mesh, target.placements  # type: ignore[attr-defined]
        saved = distribute_tensor(saved.to(device=target.device, dtype=target.dtype), mesh, placements, src_data_rank=None)
    with torch.no_grad():
        target.copy_(saved)


__all__ = ["is_sharded", "load_into", "local", "locals_of"]
