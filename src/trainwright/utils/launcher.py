"""Which launcher started this process and where it sits, read from its environment variables.

No torch import: ``trainwright env`` and the ``trainwright train --nproc`` launcher read these without loading torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal, NamedTuple

Launcher = Literal["none", "pytorch", "slurm", "mpi"]


def detect_launcher(env: Mapping[str, str] | None = None) -> Launcher:
    """Guess how this process was launched from the environment variables launchers set.

    Checked in this order, so that ``torchrun`` started inside a SLURM allocation counts as
    ``"pytorch"``:

    - ``"pytorch"``: ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` are set (``torchrun`` and
      ``torch.distributed.launch`` also set ``LOCAL_RANK`` and ``MASTER_PORT``).
    - ``"slurm"``: ``SLURM_PROCID`` and ``SLURM_NTASKS`` are set (a task started by ``srun``).
    - ``"mpi"``: ``OMPI_COMM_WORLD_RANK`` is set (Open MPI's ``mpirun``).
    - ``"none"``: otherwise; a plain single-process run.

    Args:
        env: The variables to read (default ``os.environ``).
    """
    env = os.environ if env is None else env
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

#: ``MASTER_PORT`` when a SLURM / MPI job does not set one (torchrun's default port).
DEFAULT_MASTER_PORT = "29500"


class LaunchInfo(NamedTuple):
    """Where this process sits, as its launcher describes it (see :func:`resolve_launch`)."""

    launcher: Launcher
    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None
    master_port: str | None


def first_slurm_host(nodelist: str) -> str:
    """The first host name of a SLURM node list (``"gpu[003-005,010],cpu1"`` → ``"gpu003"``), as ``scontrol show
    hostnames`` would list it first.

    Every bracket takes its first entry with its zero padding; text outside brackets is kept
    (``"rack[1-2]-n[07-08]"`` → ``"rack1-n07"``).
    """
    out: list[str] = []
    depth = 0
    i = 0
    while i < len(nodelist):
        c = nodelist[i]
        if c == "," and depth == 0:
            break
        if c == "[":
            close = nodelist.find("]", i)
            if close < 0:
                raise ValueError(
                    f"SLURM node list {nodelist!r} has an unclosed '['; set MASTER_ADDR to the first node's host name"
                )
            out.append(nodelist[i + 1 : close].split(",")[0].split("-")[0])
            i = close + 1
            continue
        out.append(c)
        i += 1
    host = "".join(out).strip()
    if not host:
        raise ValueError(f"SLURM node list {nodelist!r} names no host; set MASTER_ADDR to the first node's host name")
    return host


def slurm_master_port(env: Mapping[str, str]) -> str:
    """The rendezvous port of a SLURM job that sets no ``MASTER_PORT``: 15000 + the job id mod 20000 (29500 without a
    job id).

    A fixed port makes two jobs on one node collide: the second's rank 0 cannot bind it, and
    its other ranks join the first job's store. Every task of a job sees the same job id.
    """
    job = env.get("SLURM_JOB_ID", "").strip()
    return str(15000 + int(job) % 20000) if job.isdigit() else DEFAULT_MASTER_PORT


def resolve_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Rank, world size, local rank and rendezvous address of this process, from its launcher's variables.

    - torchrun / torchelastic: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``.
    - SLURM (``srun python train.py``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``;
      ``MASTER_ADDR`` is the first host of ``SLURM_JOB_NODELIST`` (or ``SLURM_NODELIST``) unless set;
      ``MASTER_PORT`` unless set: :func:`slurm_master_port` (from the job id, so two jobs on
      one node do not collide).
    - Open MPI (``mpirun -np N python train.py``): ``OMPI_COMM_WORLD_RANK``, ``_SIZE``,
      ``_LOCAL_RANK``; ``MASTER_ADDR`` is ``127.0.0.1`` when every process is on this node
      (``OMPI_COMM_WORLD_LOCAL_SIZE`` equals the size), otherwise it must be set (None here);
      ``MASTER_PORT`` 29500 unless set.
    - No launcher: rank 0 of 1.

    Args:
        env: The variables to read (default ``os.environ``).
    """
    env = os.environ if env is None else env
    launcher = detect_launcher(env)
    if launcher == "none":
        return LaunchInfo("none", 0, 1, int(env.get("LOCAL_RANK", 0)), env.get("MASTER_ADDR"), env.get("MASTER_PORT"))
    rank_key, world_key, local_key = _LAUNCHER_VARS[launcher]
    rank, world = int(env[rank_key]), int(env.get(world_key, 1))
    if not 0 <= rank < world:
        raise ValueError(
            f"{launcher} launch: this process's rank {rank} ({rank_key}) is not below the number of processes {world} "
            f"({world_key}): "
            "the variables come from different jobs or job steps (e.g. a job script's own SLURM_* reused by a process "
            "it started "
            "itself). Start every process through the launcher (srun / torchrun / mpirun), or unset them to train in "
            "one process"
        )
    local = int(env.get("LOCAL_RANK", env.get(local_key, 0)))
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if launcher == "slurm":
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        addr = addr or (first_slurm_host(nodelist) if nodelist else None)
        port = port or slurm_master_port(env)
    elif launcher == "mpi":
        one_node = env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "") == env.get(world_key)
        addr = addr or ("127.0.0.1" if one_node else None)
        port = port or DEFAULT_MASTER_PORT
    return LaunchInfo(launcher, rank, world, local, addr, port)


def is_launched_worker(env: Mapping[str, str] | None = None) -> bool:
    """Whether torchrun (torchelastic) started this process as one of its workers (``TORCHELASTIC_RUN_ID`` or
    ``LOCAL_RANK`` set)."""
    env = os.environ if env is None else env
    return "TORCHELASTIC_RUN_ID" in env or "LOCAL_RANK" in env


class NodeLayout(NamedTuple):
    """What a job's environment says about the machines (nodes) of a run, for a launcher that starts one node's
    processes.

    ``source`` names where it came from: ``"pytorchjob"`` (Kubernetes PyTorchJob: ``PET_*``, or
    ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` per pod), ``"slurm"`` (an ``srun`` task),
    ``"none"`` (one node). ``ntasks``: how many copies of the command the job started (one per
    node is what a launcher per node needs).
    """

    source: Literal["pytorchjob", "slurm", "none"]
    nnodes: int
    node_rank: int | None
    master_addr: str | None
    master_port: str | None
    nproc_per_node: int | None
    ntasks: int


def _int_of(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"{key}={value!r} is not a whole number; this launcher needs a fixed count (e.g. {key}=2)"
        ) from None


def resolve_nodes(env: Mapping[str, str] | None = None) -> NodeLayout:
    """The node layout of this job, read from the environment (see :class:`NodeLayout`).

    - Kubernetes PyTorchJob (Kubeflow training operator): ``PET_NNODES``, ``PET_NODE_RANK``,
      ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, ``PET_NPROC_PER_NODE`` (what torchrun reads);
      without ``PET_*``, one process per pod: ``WORLD_SIZE`` pods, this one ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT``.
    - SLURM (a task of ``srun``): ``SLURM_NNODES`` nodes, this one ``SLURM_NODEID``, ``SLURM_NTASKS``
      tasks; the address as in :func:`resolve_launch` (``MASTER_ADDR``, else the first host of the node list; port from
      the job id).
    - Otherwise one node; ``MASTER_ADDR`` / ``MASTER_PORT`` if set.

    A worker that torchrun started (:func:`is_launched_worker`) is not a node: its variables describe processes.
    """
    env = os.environ if env is None else env
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if "PET_NNODES" in env:
        return NodeLayout(
            "pytorchjob",
            _int_of(env, "PET_NNODES") or 1,
            _int_of(env, "PET_NODE_RANK") if "PET_NODE_RANK" in env else _int_of(env, "RANK"),
            env.get("PET_MASTER_ADDR") or addr,
            env.get("PET_MASTER_PORT") or port,
            _int_of(env, "PET_NPROC_PER_NODE"),
            _int_of(env, "PET_NNODES") or 1,
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        nnodes = _int_of(env, "SLURM_NNODES") or _int_of(env, "SLURM_JOB_NUM_NODES") or 1
        return NodeLayout(
            "slurm",
            nnodes,
            _int_of(env, "SLURM_NODEID") or 0,
            addr or (first_slurm_host(nodelist) if nodelist else None),
            port or slurm_master_port(env),
            None,
            _int_of(env, "SLURM_NTASKS") or 1,
        )
    if not is_launched_worker(env) and all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")):
        world = _int_of(env, "WORLD_SIZE") or 1
        return NodeLayout("pytorchjob", world, _int_of(env, "RANK"), addr, port or DEFAULT_MASTER_PORT, None, world)
    return NodeLayout("none", 1, None, addr, port, None, 1)
