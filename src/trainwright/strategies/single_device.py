"""SingleDeviceStrategy: one process, one device (CPU or one CUDA GPU)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainwright.dist.utils import launched_world_size
from trainwright.registry import STRATEGIES
from trainwright.strategies.base import Strategy


@STRATEGIES.register(name=["single", "SingleDeviceStrategy"])
class SingleDeviceStrategy(Strategy):
    """Everything on one device: no wrapping, no process group."""

    name = "single"

    def setup_env(
        self,
        *,
        cudnn_benchmark: bool = False,
        dist_cfg: Mapping[str, Any] | None = None,
        randomness: Mapping[str, Any] | None = None,
    ) -> None:
        """Refuse to run as one of several launched processes, then set up as the base strategy does.

        Raises:
            RuntimeError: a launcher (torchrun, SLURM, MPI) started several processes: each
                would train its own model and overwrite the others' checkpoints and logs.
        """
        n = launched_world_size()
        if n > 1:
            raise RuntimeError(
                f"This process is one of {n} started by a launcher (torchrun / SLURM / MPI), but strategy='single' "
                "would make each of them "
                "train its own model and overwrite the others' checkpoints and metrics.jsonl. Use strategy='ddp' (or "
                "'auto'), "
                "or start one process."
            )
        super().setup_env(cudnn_benchmark=cudnn_benchmark, dist_cfg=dist_cfg, randomness=randomness)
