"""Strategies: device placement, wrapping and state I/O for one or many processes."""

from trainwright.registry import STRATEGIES
from trainwright.strategies.base import Strategy
from trainwright.strategies.single_device import SingleDeviceStrategy


def build_strategy(strategy: "str | Strategy | dict | None" = None, **kwargs) -> Strategy:
    """Build a strategy from a name (``"single"``, ``"auto"``), a dict or an object.

    ``"auto"`` picks the single-device strategy for one process; the distributed strategies
    (``"ddp"``, ``"fsdp"``, ``"deepspeed"``) register themselves when they land.
    """
    if isinstance(strategy, Strategy):
        return strategy
    if strategy is None or strategy == "auto":
        from trainwright.dist.utils import detect_launcher

        strategy = "single" if detect_launcher() == "none" else "ddp"
        if strategy not in STRATEGIES:
            raise RuntimeError("This process was launched by torchrun/SLURM/MPI but no distributed strategy is installed yet; run with one process or strategy='single'")
    if isinstance(strategy, str):
        strategy = dict(type=strategy)
    return STRATEGIES.build(strategy, **kwargs)


__all__ = ["Strategy", "SingleDeviceStrategy", "build_strategy"]
