"""Data loading that resumes exactly."""

from trainwright.data.loader import EpochSampler, ResumableLoader, SkippableBatchSampler, build_dataloader, make_dataloader, make_resumable

__all__ = ["EpochSampler", "ResumableLoader", "SkippableBatchSampler", "build_dataloader", "make_dataloader", "make_resumable"]
