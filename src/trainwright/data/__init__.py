"""Data loading that resumes exactly."""

from trainwright.data.loader import (
    EpochSampler,
    ResumableLoader,
    SkippableBatchSampler,
    build_dataloader,
    make_dataloader,
    make_resumable,
)
from trainwright.data.wrappers import ClassBalancedDataset, ConcatDataset, RepeatDataset

__all__ = [
    "ClassBalancedDataset",
    "ConcatDataset",
    "RepeatDataset",
    "EpochSampler",
    "ResumableLoader",
    "SkippableBatchSampler",
    "build_dataloader",
    "make_dataloader",
    "make_resumable",
]
