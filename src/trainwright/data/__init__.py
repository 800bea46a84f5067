"""Data loading that resumes exactly."""

from trainwright.data.loader import (
    EpochSampler,
    ResumableLoader,
    SkippableBatchSampler,
    build_dataloader,
    make_dataloader,
    make_resumable,
)
from trainwright.data.mixture import Mixture
from trainwright.data.split import EvenEnd, StreamShard, split_stream
from trainwright.data.wrappers import ClassBalancedDataset, ConcatDataset, RepeatDataset

__all__ = [
    "ClassBalancedDataset",
    "ConcatDataset",
    "RepeatDataset",
    "EpochSampler",
    "EvenEnd",
    "Mixture",
    "StreamShard",
    "split_stream",
    "ResumableLoader",
    "SkippableBatchSampler",
    "build_dataloader",
    "make_dataloader",
    "make_resumable",
]
