"""Evaluation: ``Metric`` (per-batch ``process``, cross-rank ``evaluate``), ``Evaluator``, stock metrics."""

from __future__ import annotations

from trainwright.evaluation.collect import collect_results, merge_rank_results
from trainwright.evaluation.evaluator import Evaluator
from trainwright.evaluation.metric import Metric
from trainwright.evaluation.metrics import Accuracy

__all__ = ["Accuracy", "Evaluator", "Metric", "collect_results", "merge_rank_results"]
