"""Stock metrics; importing this package registers them in ``trainwright.registry.METRICS``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.evaluation.metrics.accuracy import Accuracy


#: Loaded on first use (PEP 562): a run keeps only the code it uses.
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())

__all__ = ["Accuracy"]
