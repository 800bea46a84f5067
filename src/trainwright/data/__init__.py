"""Data loading that resumes exactly."""

from typing import TYPE_CHECKING

from trainwright.data.loader import (
    EpochSampler,
    ResumableLoader,
    SkippableBatchSampler,
    build_dataloader,
    make_dataloader,
    make_resumable,
)
from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.data.mixture import Mixture
    from trainwright.data.split import EvenEnd, StreamShard, split_stream
    from trainwright.data.wrappers import ClassBalancedDataset, ConcatDataset, RepeatDataset

#: Loaded on first use (PEP 562): a run keeps only the code it uses.
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())

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
