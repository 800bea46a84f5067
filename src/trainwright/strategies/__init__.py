"""Strategies: device placement, wrapping and state I/O for one or many processes."""

from typing import TYPE_CHECKING

from trainwright.registry import STRATEGIES
from trainwright.strategies.base import Strategy
from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.strategies.ddp import DDPStrategy
    from trainwright.strategies.deepspeed import DeepSpeedStrategy
    from trainwright.strategies.fsdp import FSDPStrategy
    from trainwright.strategies.single_device import SingleDeviceStrategy


def build_strategy(strategy: "str | Strategy | dict | None" = None, **kwargs) -> Strategy:
    """Build a strategy from a name (``"single"``, ``"auto"``), a dict or an object.

    ``"auto"`` picks ``"ddp"`` when a launcher (torchrun, SLURM, MPI) started several
    processes, else the single-device strategy. ``"fsdp"`` shards the model (FSDP2);
    ``"deepspeed"`` needs the ``trainwright[deepspeed]`` extra.
    """
    if isinstance(strategy, Strategy):
        return strategy
    if strategy is None or strategy == "auto":
        from trainwright.dist.utils import launched_world_size

        strategy = "ddp" if launched_world_size() > 1 else "single"
    if isinstance(strategy, str):
        strategy = dict(type=strategy)
    return STRATEGIES.build(strategy, **kwargs)


#: Loaded on first use (PEP 562): a run keeps only the code it uses.
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())

__all__ = ["Strategy", "SingleDeviceStrategy", "DDPStrategy", "FSDPStrategy", "DeepSpeedStrategy", "build_strategy"]
