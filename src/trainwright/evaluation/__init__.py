"""Evaluation: ``Metric`` (per-batch ``process``, cross-rank ``evaluate``), ``Evaluator``, stock metrics, the
torchmetrics adapter."""

from __future__ import annotations

from trainwright.evaluation.collect import collect_results, merge_rank_results
from trainwright.evaluation.evaluator import Evaluator
from trainwright.evaluation.metric import Metric
from trainwright.evaluation.metrics import Accuracy
from trainwright.evaluation.torchmetrics_adapter import TorchMetric

__all__ = ["Accuracy", "Evaluator", "Metric", "TorchMetric", "collect_results", "merge_rank_results"]
