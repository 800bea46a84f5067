"""Rank / world helpers, launcher detection and the few collectives the engine needs.

Only ``trainwright.dist`` and ``trainwright.strategies`` import ``torch.distributed``; every
other module asks these helpers instead. Each helper is cheap and safe when no process group
exists (a plain single-process run): it answers from constants and makes no collective call,
so code can call them unconditionally.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as torch_dist

from trainwright.utils.launcher import (
    DEFAULT_MASTER_PORT,
    LaunchInfo,
    NodeLayout,
    detect_launcher,
    first_slurm_host,
    is_launched_worker,
    resolve_launch,
    resolve_nodes,
)

F = TypeVar("F", bound=Callable[..., Any])

ReduceOp = Literal["sum", "mean", "max", "min"]

_REDUCE_OPS = ("sum", "mean", "max", "min")


def is_available() -> bool:
    """Whether this torch build ships ``torch.distributed`` (some mobile/macOS builds do not)."""
    return torch_dist.is_available()


def is_distributed() -> bool:
    """Whether a default process group is initialized (and so collectives are meaningful)."""
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_rank(group: Any = None) -> int:
    """Rank of this process in ``group`` (default: the world); 0 when not distributed."""
    return torch_dist.get_rank(group) if is_distributed() else 0


def get_world_size(group: Any = None) -> int:
    """Number of processes in ``group`` (default: the world); 1 when not distributed."""
    return torch_dist.get_world_size(group) if is_distributed() else 1


def get_local_rank() -> int:
    """Rank of this process on its node: ``LOCAL_RANK`` (torchrun), else SLURM's / Open MPI's local rank; 0 without a
    launcher."""
    return resolve_launch().local_rank


def get_dist_info() -> tuple[int, int]:
    """Return ``(rank, world_size)`` of the default group; ``(0, 1)`` when not distributed."""
    return get_rank(), get_world_size()


def is_main_process() -> bool:
    """Whether this is global rank 0, the process that writes files and logs."""
    return get_rank() == 0


def barrier(group: Any = None) -> None:
    """Wait until every process of ``group`` reaches this point; no-op when not distributed."""
    if is_distributed():
        torch_dist.barrier(group)


def all_reduce(tensor: torch.Tensor, op: ReduceOp = "sum", group: Any = None) -> torch.Tensor:
    """Reduce ``tensor`` in place across ranks and return it.

    Args:
        tensor: The tensor to reduce; every rank must pass one of the same shape and dtype.
        op: ``"sum"``, ``"mean"`` (sum divided by the world size), ``"max"`` or ``"min"``.
        group: Process group; default the world.

    Returns:
        ``tensor`` itself, reduced. Unchanged when not distributed.
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"all_reduce op must be one of {_REDUCE_OPS}, got {op!r}")
    if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"all_reduce(op='mean') needs a floating-point tensor to divide in place, got {tensor.dtype}; convert it "
            "first, e.g. tensor.float()")
    if not is_distributed():
        return tensor
    reduce_op = {"sum": torch_dist.ReduceOp.SUM, "mean": torch_dist.ReduceOp.SUM, "max": torch_dist.ReduceOp.MAX, "min": torch_dist.ReduceOp.MIN}[op]
    torch_dist.all_reduce(tensor, op=reduce_op, group=group)
    if op == "mean":
        tensor.div_(get_world_size(group))
    return tensor


def all_gather_object(obj: Any, group: Any = None) -> list[Any]:
    """Gather a picklable object from every rank; ``[obj]`` when not distributed.

    Returns:
        One entry per rank, in rank order. Tensors inside ``obj`` are pickled with their
        device, so move them to CPU first unless every rank can see that device.
    """
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * get_world_size(group)
    torch_dist.all_gather_object(out, obj, group=group)
    return out


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """Return rank ``src``'s ``obj`` on every rank (the others' ``obj`` is ignored)."""
    if not is_distributed():
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def master_only(fn: F) -> F:
    """Decorate ``fn`` so that it runs only on rank 0; elsewhere the call returns ``None``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_main_process():
            return fn(*args, **kwargs)
        return None

    return wrapper  # type: ignore[return-value]


def available_backends() -> dict[str, bool]:
    """Which ``torch.distributed`` backends this torch build offers: ``{"gloo": True, "nccl": False, ...}``."""
    if not torch_dist.is_available():
        return {}
    checks = {"gloo": "is_gloo_available", "nccl": "is_nccl_available", "mpi": "is_mpi_available", "ucc": "is_ucc_available", "xccl": "is_xccl_available"}
    out = {}
    for name, fn in checks.items():
        check = getattr(torch_dist, fn, None)
        if check is not None:
            out[name] = bool(check())
    return out


def launched_world_size() -> int:
    """How many processes the launcher says it started (1 when none did): ``WORLD_SIZE``, ``SLURM_NTASKS`` or
    ``OMPI_COMM_WORLD_SIZE``."""
    return resolve_launch().world_size


def export_launcher_env() -> None:
    """Fill in ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` / ``MASTER_PORT`` from SLURM's or Open MPI's
    variables.

    torchrun sets them itself; see :func:`resolve_launch` for where each comes from. A
    variable that is set already is kept. ``MASTER_ADDR`` of a multi-node MPI job cannot be
    derived: it stays unset (the DDP strategy's error then says to set it).
    """
    info = resolve_launch()
    if info.launcher not in ("slurm", "mpi"):
        return
    values = {"RANK": info.rank, "WORLD_SIZE": info.world_size, "LOCAL_RANK": info.local_rank, "MASTER_ADDR": info.master_addr, "MASTER_PORT": info.master_port}
    for key, value in values.items():
        if value is not None:
            os.environ.setdefault(key, str(value))


__all__ = [
    "DEFAULT_MASTER_PORT",
    "LaunchInfo",
    "NodeLayout",
    "is_launched_worker",
    "resolve_nodes",
    "export_launcher_env",
    "first_slurm_host",
    "resolve_launch",
    "launched_world_size",
    "all_gather_object",
    "all_reduce",
    "available_backends",
    "barrier",
    "broadcast_object",
    "detect_launcher",
    "get_dist_info",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "is_available",
    "is_distributed",
    "is_main_process",
    "master_only",
]
