"""``BaseMetric``: mmengine's metric base class, a :class:`~trainwright.evaluation.Metric` whose reduction is
``compute_metrics``."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from trainwright.evaluation.collect import Device
from trainwright.evaluation.metric import Metric


class BaseMetric(Metric):
    """mmengine's ``BaseMetric``: ``process(data_batch, data_samples)`` appends to ``self.results``,
    ``compute_metrics(results)`` reduces.

    :meth:`compute` is ``compute_metrics``: a metric ported from mmengine keeps its two methods
    and its ``prefix`` / ``default_prefix`` / ``collect_device``; gathering across ranks, dataset
    order and padding are :class:`~trainwright.evaluation.Metric`'s. As there, ``self.results``
    holds one entry per sample, or (mmengine's habit) one small entry per batch: results
    beyond the dataset's size are dropped, which a per-batch list never reaches on one
    process (several processes: store per-sample entries, or set ``batched_results = True``).

    Args:
        collect_device: Where ``compute_metrics`` receives tensors: ``"cpu"`` (default) or ``"gpu"``.
        prefix: Every key ``compute_metrics`` returns becomes ``f"{prefix}/{key}"``; default ``default_prefix``.
        collect_dir: mmengine's folder for CPU collection through files; trainwright gathers
            through the process group, so only None is accepted.
    """

    def __init__(
        self, collect_device: Device = "cpu", prefix: str | None = None, collect_dir: str | None = None
    ) -> None:
        if collect_dir is not None:
            raise ValueError(
                f"{type(self).__name__}(collect_dir={collect_dir!r}): trainwright gathers metric results through the "
                "process group, "
                "not through a shared folder; drop collect_dir"
            )
        super().__init__(collect_device=collect_device, prefix=prefix)
        #: mmengine's ``dataset_meta`` (class names, palette...): set by whoever knows the dataset; None otherwise.
        self.dataset_meta: dict[str, Any] | None = None

    @abstractmethod
    def process(self, data_batch: Any, data_samples: Any) -> None:
        """Append this batch's results to ``self.results`` (``data_samples``: what the model's ``val_step`` /
        ``test_step`` returned)."""

    @abstractmethod
    def compute_metrics(self, results: list[Any]) -> dict[str, Any]:
        """Reduce the complete results of the dataset (every rank's, in dataset order) to named numbers; runs on rank
        0."""

    def compute(self, results: list[Any]) -> dict[str, float]:
        """:meth:`compute_metrics` (mmengine's name of the reduction)."""
        return self.compute_metrics(results)


__all__ = ["BaseMetric"]
