"""Evaluation: ``Metric`` (per-batch ``process``, cross-rank ``evaluate``), ``Evaluator``, stock metrics, the
torchmetrics adapter."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainwright.evaluation.collect import collect_results, merge_rank_results
from trainwright.evaluation.evaluator import Evaluator
from trainwright.evaluation.metric import Metric
from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.evaluation.metrics import Accuracy
    from trainwright.evaluation.torchmetrics_adapter import TorchMetric

#: Loaded on first use (PEP 562): a run keeps only the code it uses.
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())

__all__ = ["Accuracy", "Evaluator", "Metric", "TorchMetric", "collect_results", "merge_rank_results"]
