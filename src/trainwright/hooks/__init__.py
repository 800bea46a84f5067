"""Hooks: the base class, dispatch, and the stock hooks."""

from typing import TYPE_CHECKING

from trainwright.hooks.dispatch import HookList
from trainwright.hooks.hook import EVENTS, Hook
from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.hooks.checkpoint import CheckpointHook
    from trainwright.hooks.early_stopping import EarlyStoppingHook
    from trainwright.hooks.ema import EMAHook
    from trainwright.hooks.empty_cache import EmptyCacheHook
    from trainwright.hooks.export import SafetensorsExportHook
    from trainwright.hooks.flops import FlopsHook
    from trainwright.hooks.iter_timer import IterTimerHook
    from trainwright.hooks.logger import LoggerHook
    from trainwright.hooks.memory import MemorySnapshotHook
    from trainwright.hooks.norms import NormsHook
    from trainwright.hooks.param_scheduler import ParamSchedulerHook
    from trainwright.hooks.precise_bn import PreciseBNHook
    from trainwright.hooks.preemption import PreemptionHook
    from trainwright.hooks.profiler import ProfilerHook
    from trainwright.hooks.progress_bar import ProgressBarHook
    from trainwright.hooks.runtime_info import RuntimeInfoHook
    from trainwright.hooks.sampler_seed import DistSamplerSeedHook
    from trainwright.hooks.stall import StallHook
    from trainwright.hooks.swa import SWAHook
    from trainwright.hooks.sync_buffers import SyncBuffersHook

#: Loaded on first use (PEP 562): a run keeps only the code it uses.
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())

__all__ = [
    "Hook",
    "HookList",
    "EVENTS",
    "CheckpointHook",
    "IterTimerHook",
    "LoggerHook",
    "ParamSchedulerHook",
    "DistSamplerSeedHook",
    "EMAHook",
    "EarlyStoppingHook",
    "FlopsHook",
    "PreemptionHook",
    "ProfilerHook",
    "ProgressBarHook",
    "RuntimeInfoHook",
    "NormsHook",
    "MemorySnapshotHook",
    "SWAHook",
    "StallHook",
    "SyncBuffersHook",
    "PreciseBNHook",
    "EmptyCacheHook",
    "SafetensorsExportHook",
]
