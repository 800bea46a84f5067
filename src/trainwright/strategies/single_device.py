"""SingleDeviceStrategy: one process, one device (CPU or one CUDA GPU)."""

from __future__ import annotations

from trainwright.registry import STRATEGIES
from trainwright.strategies.base import Strategy


@STRATEGIES.register(name="single")
class SingleDeviceStrategy(Strategy):
    """Everything on one device: no wrapping, no process group."""

    name = "single"


STRATEGIES.register(SingleDeviceStrategy)
