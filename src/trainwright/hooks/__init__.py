"""Hooks: the base class, dispatch, and the stock hooks."""

from trainwright.hooks.checkpoint import CheckpointHook
from trainwright.hooks.dispatch import HookList
from trainwright.hooks.early_stopping import EarlyStoppingHook
from trainwright.hooks.ema import EMAHook
from trainwright.hooks.empty_cache import EmptyCacheHook
from trainwright.hooks.export import SafetensorsExportHook
from trainwright.hooks.flops import FlopsHook
from trainwright.hooks.hook import EVENTS, Hook
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
