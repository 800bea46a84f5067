"""mmengine's ``mmengine.evaluator`` import path: ``BaseMetric`` and ``Evaluator``.

A script that writes ``from mmengine.evaluator import BaseMetric`` runs with
``from trainwright.evaluator import BaseMetric``. The work is :mod:`trainwright.evaluation`'s.
"""

from __future__ import annotations

from trainwright.evaluation.evaluator import Evaluator
from trainwright.evaluator.base_metric import BaseMetric

__all__ = ["BaseMetric", "Evaluator"]
