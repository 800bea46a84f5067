"""``TorchMetric``: any ``torchmetrics.Metric`` (or ``MetricCollection``) as a trainwright metric.

The torchmetrics object accumulates its own state on the device (``update`` per batch) and
synchronises it across processes itself when ``compute`` runs; the adapter only finds the
predictions and the target of each batch, moves the metric to their device once, and turns
what ``compute`` returns into named floats. An ``Evaluator`` (and so ``val_evaluator=`` /
``test_evaluator=``) wraps a torchmetrics object it is given in this adapter by itself.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from trainwright.evaluation.inputs import pred_and_target
from trainwright.evaluation.metric import Metric, as_numbers, is_torchmetric
from trainwright.registry import METRICS


@METRICS.register
class TorchMetric(Metric):
    """Run a ``torchmetrics`` metric as a validation / test metric, beside trainwright's own.

    Per batch it calls ``metric.update(preds, target)`` with the predictions and target found
    as :class:`~trainwright.evaluation.Accuracy` finds them (``outputs`` or its ``"pred"`` /
    ``"logits"`` entry; the target from ``outputs``, the batch's last element or its
    ``"label"`` / ``"target"`` entry; see :func:`trainwright.evaluation.inputs.pred_and_target`),
    or with what ``input_fn(data_batch, outputs)`` returns. After the pass, ``compute()`` gives
    the result (synchronised across processes by torchmetrics itself) and the state is reset.

    Result keys: a single number is named ``key`` (default: the metric's class name, e.g.
    ``"MulticlassAccuracy"``); a dict (a ``MetricCollection``) keeps its keys; a tensor of
    several values (per class) gives ``key/0``, ``key/1``, ... A ``prefix`` is put in front as
    for every metric.

    With several processes the samples a ``DistributedSampler`` repeats to even out the
    shards are counted again (torchmetrics' own behaviour); use a sampler without padding or a
    dataset size divisible by the number of processes when that matters.
    trainwright's own metrics (``Accuracy``) drop that padding.

    Args:
        metric: A ``torchmetrics.Metric`` / ``MetricCollection``, or the name of a class of the
            ``torchmetrics`` package (``"MulticlassAccuracy"``, ``"classification.MulticlassF1Score"``),
            built with ``metric_args``.
        key: Name of a single-number result; default: the metric's class name.
        input_fn: ``input_fn(data_batch, outputs) -> args`` of ``metric.update(*args)``, when
            the metric needs other inputs than ``(preds, target)``.
        target_key: Name of the target in dict batches / outputs, when none of the default names.
        metric_args: Arguments of the class named by ``metric``.
        prefix: See :class:`Metric`.
    """

    def __init__(
        self,
        metric: Any,
        key: str | None = None,
        input_fn: Callable[[Any, Any], tuple[Any, ...]] | None = None,
        target_key: str | None = None,
        metric_args: Mapping[str, Any] | None = None,
        prefix: str | None = None,
    ) -> None:
        super().__init__(prefix=prefix)
        if isinstance(metric, str):
            try:
                import torchmetrics
            except ImportError as e:
                raise ImportError(f"TorchMetric({metric!r}) needs torchmetrics: pip install torchmetrics") from e
            cls = _torchmetrics_class(torchmetrics, metric)
            if cls is None:
                raise KeyError(
                    f"torchmetrics has no metric class {metric!r}; use a top-level name such as 'MulticlassAccuracy', "
                    "a module path such as "
                    "'classification.MulticlassF1Score', or pass the metric object"
                )
            metric = cls(**dict(metric_args or {}))
        elif metric_args:
            raise ValueError(
                "metric_args is for a metric given by name (metric='MulticlassAccuracy'); pass the arguments to the "
                "object you built instead"
            )
        if not is_torchmetric(metric):
            raise TypeError(
                f"TorchMetric wraps a torchmetrics.Metric or MetricCollection, got {type(metric).__name__}; subclass "
                "trainwright.evaluation.Metric for other metrics"
            )
        self.metric: Any = metric
        self.key = key or type(metric).__name__
        self.input_fn = input_fn
        self.target_key = target_key
        self._device: torch.device | None = None
        self._updates = 0

    def process(self, data_batch: Any, outputs: Any) -> None:
        """Update the torchmetrics state with this batch (on the predictions' device; no host sync)."""
        if self.input_fn is not None:
            args = tuple(self.input_fn(data_batch, outputs))
        else:
            pred, target = pred_and_target(data_batch, outputs, self.target_key, "TorchMetric")
            if not isinstance(pred, torch.Tensor):
                raise TypeError(
                    "TorchMetric expects the predictions to be a tensor (or a dict holding one under 'pred' / "
                    f"'logits'), got {type(pred).__name__}; or pass input_fn"
                )
            args = (pred, torch.as_tensor(target).to(pred.device, non_blocking=True))
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        if device is not None and device != self._device:
            self.metric.to(device)
            self._device = device
        self.metric.update(*args)
        self._updates += 1

    def compute(self, results: list[Any]) -> dict[str, float]:
        """The torchmetrics result as named floats (the state is the metric's own; ``results`` is unused)."""
        return self._named(self.metric.compute())

    def evaluate(self, size: int) -> dict[str, float]:
        """``compute()`` (torchmetrics synchronises the processes), then reset; the same dict on every process."""
        group = self.collectives
        updates = self._updates if group.world_size == 1 else sum(group.gather_object(self._updates))
        try:
            if updates == 0:
                raise ValueError(
                    f"TorchMetric({self.key}) has no results to evaluate: process() was never called. Check that the "
                    "validation data loader is not empty."
                )
            metrics = as_numbers(self.compute([]), f"TorchMetric({self.key})")
        finally:
            self.reset()
        if self.prefix:
            return {f"{self.prefix}/{k}": v for k, v in metrics.items()}
        return metrics

    def reset(self) -> None:
        """Reset the torchmetrics state."""
        self.metric.reset()
        self._updates = 0

    def state_dict(self) -> dict[str, Any]:
        """The torchmetrics state accumulated so far (a checkpoint taken mid-validation keeps it)."""
        return {"updates": self._updates, "states": _states(self.metric)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        for name, states in state_dict["states"].items():
            target = self.metric if name == "" else self.metric[name]
            for attr, value in states.items():
                setattr(target, attr, value)
        self._updates = int(state_dict["updates"])

    def _named(self, value: Any) -> dict[str, Any]:
        if isinstance(value, Mapping):
            return {str(k): v for k, v in value.items()}
        if isinstance(value, torch.Tensor) and value.numel() > 1:
            return {f"{self.key}/{i}": v for i, v in enumerate(value.reshape(-1).tolist())}
        return {self.key: value}

    def __repr__(self) -> str:
        return (
            f"TorchMetric({getattr(self, 'metric', None)!r}, key={getattr(self, 'key', None)!r}, "
            f"prefix={self.prefix!r})"
        )


def _torchmetrics_class(torchmetrics: Any, name: str) -> Any:
    """``torchmetrics.<name>``, where ``name`` may hold a module path (``"classification.MulticlassF1Score"``)."""
    module_path, _, cls = name.rpartition(".")
    try:
        module = importlib.import_module(f"torchmetrics.{module_path}") if module_path else torchmetrics
    except ImportError:
        return None
    return getattr(module, cls, None)


def _states(metric: Any) -> dict[str, dict[str, Any]]:
    """Every accumulated state (``metric_state``) by member name ("" for a single metric)."""
    tm = sys.modules["torchmetrics"]
    if isinstance(metric, tm.MetricCollection):
        return {name: dict(m.metric_state) for name, m in metric.items(keep_base=True)}
    return {"": dict(metric.metric_state)}
