"""Tuners: the learning-rate range test and the batch-size finder, each leaving the trainer exactly as it was.

``Trainer.find_lr`` / ``Trainer.find_batch_size`` build the train parts and call these; the
state they change is put back by :func:`~trainwright.tuning.state.preserved`. See docs/diagnose.md.
"""

from trainwright.tuning.batch_size import find_batch_size, with_batch_size
from trainwright.tuning.lr_finder import LRFinderResult, find_lr
from trainwright.tuning.state import preserved

__all__ = ["LRFinderResult", "find_batch_size", "find_lr", "preserved", "with_batch_size"]
