"""The ``Metric`` base class: accumulate per batch without syncing, reduce once at the end.

Validation runs ``process`` after every batch and ``evaluate`` once per validation epoch.
``process`` must stay on the device (no ``.item()``, ``.cpu()``, ``.tolist()``, no Python
``if`` on a tensor): each of those waits for the GPU and would serialise validation.
``evaluate`` is where results are moved to the host, gathered across ranks and reduced.
"""

from __future__ import annotations

import numbers
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from trainwright.evaluation.collect import DEFAULT_GROUP, Collectives, Device, collect_results


class Metric(ABC):
    """Base class of evaluation metrics.

    Subclasses implement :meth:`process` (called once per batch; appends to
    ``self.results``) and :meth:`compute` (turns the complete, gathered results into
    numbers). :meth:`evaluate` does the rest: gather from every rank, restore dataset order,
    drop the padding a ``DistributedSampler`` adds, compute on rank 0, broadcast the numbers.

    How to store results — the layout is declared by the class attribute ``batched_results``:

    - ``batched_results = False`` (default): append **one entry per sample** (any picklable
      object; tensors are fine). ``compute`` receives the list of samples, in dataset order,
      exactly ``size`` long.
    - ``batched_results = True``: append **one entry per batch**: a tensor, or a dict / tuple
      of tensors, whose dim 0 indexes the samples of that batch (e.g. a per-sample bool
      "correct" vector). This is the cheap layout: one small device tensor per batch, no
      Python work per sample. ``compute`` receives a list holding a single batch that covers
      the whole dataset (exactly ``size`` rows), so a ``compute`` written as "for each batch
      in results" works unchanged.

    Storing only a per-batch count (a 0-dim tensor) is not supported: with several ranks the
    padding samples could not be removed and the metric would be slightly wrong.

    Args:
        collect_device: Device on which ``compute`` receives tensors: ``"cpu"`` (default),
            ``"gpu"`` / ``"cuda"`` (the current CUDA device) or a ``torch.device``. Results
            always travel between ranks as CPU pickles.
        prefix: If given, every key ``compute`` returns becomes ``f"{prefix}/{key}"``; use it
            to tell two instances of one metric apart. Defaults to ``default_prefix``.
    """

    batched_results: ClassVar[bool] = False
    default_prefix: ClassVar[str | None] = None
    #: The process group :meth:`evaluate` gathers over: the Trainer sets its strategy (through the Evaluator); default:
    #: the process's default group.
    collectives: Collectives = DEFAULT_GROUP

    def __init__(self, collect_device: Device = "cpu", prefix: str | None = None) -> None:
        self.collect_device = collect_device
        self.prefix = prefix if prefix is not None else self.default_prefix
        self.results: list[Any] = []

    @abstractmethod
    def process(self, data_batch: Any, outputs: Any) -> None:
        """Append this batch's results to ``self.results``, staying on the device.

        Args:
            data_batch: The batch as the data loader yielded it (holds the targets).
            outputs: What the model's ``val_step`` / ``test_step`` returned for it.
        """

    @abstractmethod
    def compute(self, results: list[Any]) -> dict[str, float]:
        """Reduce the complete results of the dataset to named numbers (runs on rank 0 only)."""

    def evaluate(self, size: int) -> dict[str, float]:
        """Gather results from every rank, compute the metric, and return it on every rank.

        Clears ``self.results`` whatever happens, so the next validation starts empty.

        Args:
            size: Number of samples in the whole dataset (``len(dataloader.dataset)``);
                results beyond it are a ``DistributedSampler``'s padding and are dropped.

        Returns:
            The metric values, keys prefixed with ``prefix/`` if a prefix is set; the same
            dict on every rank.
        """
        name = type(self).__name__
        try:
            results = collect_results(
                self.results,
                size,
                batched=self.batched_results,
                device=self.collect_device,
                collectives=self.collectives,
            )
        finally:
            self.results.clear()
        if not results:
            # every rank holds the same gathered list, so every rank raises here together
            raise ValueError(
                f"{name} has no results to evaluate: process() was never called with any sample. Check that the "
                "validation data loader is not empty."
            )
        metrics: dict[str, float] | None = None
        error: BaseException | None = None
        group = self.collectives
        if group.is_main_process:
            try:
                metrics = as_numbers(self.compute(results), name)
            except Exception as exc:  # re-raised below, after the other ranks are told
                error = exc
        if group.world_size > 1:
            # tell the other ranks what happened, so that none of them waits forever
            metrics, message = group.broadcast_object(
                (metrics, None if error is None else f"{type(error).__name__}: {error}")
            )
            if error is None and message is not None:
                raise RuntimeError(f"{name}.compute() failed on rank 0 ({message}); see rank 0's traceback.")
        if error is not None:
            raise error
        assert metrics is not None
        if self.prefix:
            return {f"{self.prefix}/{k}": v for k, v in metrics.items()}
        return metrics

    def reset(self) -> None:
        """Drop the accumulated results (e.g. after an interrupted validation)."""
        self.results.clear()

    def state_dict(self) -> dict[str, Any]:
        """The results accumulated so far (a checkpoint taken mid-validation keeps them)."""
        return {"results": list(self.results)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore results saved by :meth:`state_dict`."""
        self.results = list(state_dict["results"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(collect_device={self.collect_device!r}, prefix={self.prefix!r})"


def as_numbers(metrics: Any, name: str) -> dict[str, float]:
    """What a metric's ``compute`` returned, checked to be a dict, with one-element tensors / numpy scalars as Python
    numbers.

    Every metric's result goes through it (:class:`Metric` and the torchmetrics adapter), so
    logs, checkpoints and ``save_best`` see plain numbers whatever the metric computed with.

    Args:
        metrics: The value ``compute`` returned.
        name: The metric's name, for the error message.

    Raises:
        TypeError: ``metrics`` is not a mapping.
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{name}.compute() must return a dict of metric name -> float, got {type(metrics).__name__}")
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        elif isinstance(value, numbers.Number) and hasattr(value, "item"):
            value = value.item()  # numpy scalars -> Python numbers
        out[str(key)] = value
    return out


def is_torchmetric(obj: Any) -> bool:
    """True for a ``torchmetrics.Metric`` or ``MetricCollection`` (without importing torchmetrics when the user did
    not)."""
    tm = sys.modules.get("torchmetrics")
    return tm is not None and isinstance(obj, (tm.Metric, tm.MetricCollection))


__all__ = ["Metric", "as_numbers", "is_torchmetric"]
