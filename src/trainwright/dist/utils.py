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

F = TypeVar("F", bound=Callable[..., Any])

ReduceOp = Literal["sum", "mean", "max", "min"]
Launcher = Literal["none", "pytorch", "slurm", "mpi"]

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
    """Rank of this process on its node, from the ``LOCAL_RANK`` variable launchers set; else 0."""
    return int(os.environ.get("LOCAL_RANK", "0"))


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
        raise TypeError(f"all_reduce(op='mean') needs a floating-point tensor to divide in place, got {tensor.dtype}; convert it first, e.g. tensor.float()")
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


def detect_launcher() -> Launcher:
    """Guess how this process was launched from the environment variables launchers set.

    Checked in this order, so that ``torchrun`` started inside a SLURM allocation counts as
    ``"pytorch"``:

    - ``"pytorch"``: ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` are set (``torchrun`` and
      ``torch.distributed.launch`` also set ``LOCAL_RANK`` and ``MASTER_PORT``).
    - ``"slurm"``: ``SLURM_PROCID`` and ``SLURM_NTASKS`` are set (a task started by ``srun``).
    - ``"mpi"``: ``OMPI_COMM_WORLD_RANK`` is set (Open MPI's ``mpirun``).
    - ``"none"``: otherwise; a plain single-process run.
    """
    env = os.environ
    if all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):
        return "pytorch"
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return "slurm"
    if "OMPI_COMM_WORLD_RANK" in env:
        return "mpi"
    return "none"


#: Per launcher, the variables that hold (rank, world size, local rank).
_LAUNCHER_VARS = {
    "pytorch": ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    "mpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
}


def launched_world_size() -> int:
    """How many processes the launcher says it started (1 when none did): ``WORLD_SIZE``, ``SLURM_NTASKS`` or ``OMPI_COMM_WORLD_SIZE``."""
    launcher = detect_launcher()
    if launcher == "none":
        return 1
    return int(os.environ.get(_LAUNCHER_VARS[launcher][1], 1))


def export_launcher_env() -> None:
    """Fill in ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` from SLURM's or Open MPI's variables (torchrun sets them itself).

    ``MASTER_ADDR`` / ``MASTER_PORT`` must come from the job script (e.g. the first host of
    ``scontrol show hostnames $SLURM_JOB_NODELIST``).
    """
    env = os.environ
    launcher = detect_launcher()
    if launcher in ("slurm", "mpi"):
        for ours, theirs in zip(_LAUNCHER_VARS["pytorch"], _LAUNCHER_VARS[launcher]):
            if theirs in env:
                env.setdefault(ours, env[theirs])


__all__ = [
    "export_launcher_env",
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
