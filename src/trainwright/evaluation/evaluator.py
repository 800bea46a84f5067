"""``Evaluator``: several metrics fed the same batches, their results merged into one dict."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainwright.evaluation.collect import Collectives
from trainwright.evaluation.metric import Metric, is_torchmetric
from trainwright.registry import METRICS


class Evaluator:
    """Run a set of metrics over a dataset and merge what they report.

    Metric keys are bare (``"acc"``); the validation / test loop adds its ``"val/"`` or
    ``"test/"`` prefix.

    Args:
        metrics: A :class:`Metric`, a config dict such as ``dict(type="Accuracy", topk=(1, 5))``
            (built through ``trainwright.registry.METRICS``), a ``torchmetrics.Metric`` /
            ``MetricCollection`` (run through :class:`~trainwright.evaluation.TorchMetric`),
            or a list of those.
    """

    def __init__(self, metrics: Metric | Mapping[str, Any] | Sequence[Metric | Mapping[str, Any]]) -> None:
        items = [metrics] if isinstance(metrics, (Metric, Mapping)) or is_torchmetric(metrics) else list(metrics)
        if not items:
            raise ValueError("Evaluator needs at least one metric, e.g. Evaluator(dict(type='Accuracy'))")
        self.metrics: list[Metric] = []
        for item in items:
            metric = METRICS.get("TorchMetric")(item) if is_torchmetric(item) else METRICS.build(item)
            if not isinstance(metric, Metric):
                raise TypeError(
                    f"Evaluator metrics must be Metric instances or METRICS config dicts; got {type(metric).__name__}. "
                    "Subclass trainwright.evaluation.Metric."
                )
            self.metrics.append(metric)

    def use_collectives(self, collectives: Collectives) -> None:
        """Gather every metric's results over ``collectives`` (the Trainer's strategy) instead of the default group."""
        for metric in self.metrics:
            metric.collectives = collectives

    def process(self, data_batch: Any, outputs: Any) -> None:
        """Feed one batch and the model's outputs for it to every metric."""
        for metric in self.metrics:
            metric.process(data_batch, outputs)

    def evaluate(self, size: int) -> dict[str, float]:
        """Evaluate every metric over ``size`` samples and merge their dicts.

        Raises:
            ValueError: If two metrics report the same key (give one of them a ``prefix``).
        """
        merged: dict[str, float] = {}
        owner: dict[str, Metric] = {}
        # evaluate all first: each evaluate is a collective, every rank must run all of them
        reports = [(metric, metric.evaluate(size)) for metric in self.metrics]
        for metric, values in reports:
            for key, value in values.items():
                if key in merged:
                    raise ValueError(
                        f"Metrics {owner[key]!r} and {metric!r} both report the key {key!r}; give one of them "
                        f"a prefix, e.g. dict(type={type(metric).__name__!r}, prefix='other')"
                    )
                merged[key] = value
                owner[key] = metric
        return merged

    def reset(self) -> None:
        """Drop every metric's accumulated results."""
        for metric in self.metrics:
            metric.reset()

    def state_dict(self) -> dict[str, Any]:
        """Each metric's state, by position."""
        return {"metrics": [metric.state_dict() for metric in self.metrics]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the metrics' states saved by :meth:`state_dict` (same metrics, same order)."""
        states = state_dict["metrics"]
        if len(states) != len(self.metrics):
            raise ValueError(
                f"The evaluator state holds {len(states)} metrics but this evaluator has {len(self.metrics)}; build it "
                "with the same metrics as when it was saved"
            )
        for metric, state in zip(self.metrics, states):
            metric.load_state_dict(state)

    def __len__(self) -> int:
        return len(self.metrics)


__all__ = ["Evaluator"]
