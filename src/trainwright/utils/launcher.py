"""Which launcher started this process, read from its environment variables (no torch import: ``trainwright env``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

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
