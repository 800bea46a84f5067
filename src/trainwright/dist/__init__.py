"""Distributed helpers: the one place (with ``strategies``) that imports ``torch.distributed``."""

from __future__ import annotations

from trainwright.dist import utils
from trainwright.dist.utils import (
    DEFAULT_MASTER_PORT,
    LaunchInfo,
    NodeLayout,
    is_launched_worker,
    resolve_nodes,
    export_launcher_env,
    first_slurm_host,
    launched_world_size,
    resolve_launch,
    all_gather_object,
    all_reduce,
    available_backends,
    barrier,
    broadcast_object,
    detect_launcher,
    get_dist_info,
    get_local_rank,
    get_rank,
    get_world_size,
    is_available,
    is_distributed,
    is_main_process,
    master_only,
)

__all__ = list(utils.__all__)
