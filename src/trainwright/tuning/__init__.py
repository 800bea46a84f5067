"""Tuners: the learning-rate range test and the batch-size finder, each leaving the trainer exactly as it was.

``Trainer.find_lr`` / ``Trainer.find_batch_size`` build the train parts and call these; the
state they change is put back by :func:`~trainwright.tuning.state.preserved`. See docs/diagnose.md.
"""

from typing import TYPE_CHECKING

from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.tuning.batch_size import find_batch_size, with_batch_size
    from trainwright.tuning.lr_finder import LRFinderResult, find_lr
    from trainwright.tuning.state import preserved


#: Loaded on first use (PEP 562): a run keeps only the code it uses.
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())

__all__ = ["LRFinderResult", "find_batch_size", "find_lr", "preserved", "with_batch_size"]
