"""Optimization: OptimWrapper (accumulation, clipping, precision), builders, schedulers."""

from trainwright.optim.builder import build_optim_wrapper, build_optimizer
from trainwright.optim.constructor import DefaultOptimWrapperConstructor
from trainwright.optim.optim_wrapper import AmpOptimWrapper, OptimWrapper
from trainwright.optim.optim_wrapper_dict import OptimWrapperDict, optim_wrappers_of
from trainwright.optim.scheduler import build_param_schedulers

__all__ = [
    "DefaultOptimWrapperConstructor",
    "OptimWrapper",
    "AmpOptimWrapper",
    "OptimWrapperDict",
    "build_optim_wrapper",
    "build_optimizer",
    "build_param_schedulers",
    "optim_wrappers_of",
]
