"""Stock metrics; importing this package registers them in ``trainwright.registry.METRICS``."""

from __future__ import annotations

from trainwright.evaluation.metrics.accuracy import Accuracy

__all__ = ["Accuracy"]
