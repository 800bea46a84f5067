"""Top-k classification accuracy, as a fraction in [0, 1]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from trainwright.evaluation.collect import Device
from trainwright.evaluation.inputs import pred_and_target
from trainwright.evaluation.metric import Metric
from trainwright.registry import METRICS

# rank stored for a wrong label-only prediction and for a target outside [0, C)
_WRONG = torch.iinfo(torch.int64).max
_INVALID = -1


@METRICS.register
class Accuracy(Metric):
    """Fraction of samples whose target is among the ``k`` highest-scored classes.

    Values are fractions in ``[0, 1]`` like scikit-learn's ``accuracy_score`` and
    torchmetrics (mmengine / mmpretrain report percentages; multiply by 100 for those).

    Inputs, per batch:

    - ``outputs``: scores or logits of shape ``(N, C)``, or predicted labels of shape
      ``(N,)`` (then only ``topk=1`` is possible); or a dict holding them under ``"pred"``,
      ``"preds"``, ``"logits"`` or ``"scores"``, and optionally the target too.
    - the target: from ``outputs`` if it is a dict with a target key, else from
      ``data_batch``: its last element for a tuple / list batch; for a dict batch the entry
      ``target_key``, or the first of ``"label"``, ``"labels"``, ``"target"``, ``"targets"``,
      ``"y"``. Class indices of shape ``(N,)`` or ``(N, 1)``; one-hot or soft targets of
      shape ``(N, C)`` count as their highest-scored class.

    Ties are broken like ``argmax``: among equal scores the lower class index ranks first, so
    top-1 accuracy equals ``accuracy_score(target, scores.argmax(1))``. NaN scores rank above
    every number, as in ``torch.argmax`` / ``torch.topk``.

    ``process`` stores, per batch, one int64 per sample — the rank of the target class among
    the scores — as a device tensor: no host sync per batch, and exact results with a padding
    ``DistributedSampler`` (see :class:`Metric`).

    Args:
        topk: ``k`` or several ``k`` values. Result keys: ``"acc"`` for a single ``k == 1``,
            else ``"acc/top{k}"`` for each.
        target_key: Name of the target in dict batches / dict outputs, when it is none of the
            default names above.
        collect_device: See :class:`Metric`.
        prefix: See :class:`Metric`.
    """

    batched_results = True

    def __init__(
        self,
        topk: int | Sequence[int] = 1,
        target_key: str | None = None,
        collect_device: Device = "cpu",
        prefix: str | None = None,
    ) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        ks = (topk,) if isinstance(topk, int) else tuple(topk)
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
            raise ValueError(
                f"topk must be a positive int or a non-empty tuple of them, e.g. topk=(1, 5); got {topk!r}"
            )
        self.topk: tuple[int, ...] = tuple(dict.fromkeys(ks))
        self.target_key = target_key

    @override
    def process(self, data_batch: Any, outputs: Any) -> None:
        pred, target = self._pred_and_target(data_batch, outputs)
        self.results.append(self._target_rank(pred, target))

    @override
    def compute(self, results: list[Any]) -> dict[str, float]:
        ranks = torch.cat([r.reshape(-1) for r in results])
        invalid = int((ranks == _INVALID).sum())
        if invalid:
            raise ValueError(
                f"Accuracy got {invalid} target label(s) outside [0, num_classes) of the scores; check the labels "
                f"(e.g. an ignore index such as -1 or 255) and drop those samples, or fix the number of outputs."
            )
        total = ranks.numel()
        values = {k: float((ranks < k).sum()) / total for k in self.topk}
        if self.topk == (1,):
            return {"acc": values[1]}
        return {f"acc/top{k}": v for k, v in values.items()}

    def _pred_and_target(self, data_batch: Any, outputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        pred, target = pred_and_target(data_batch, outputs, self.target_key, "Accuracy")
        if not isinstance(pred, torch.Tensor):
            raise TypeError(
                "Accuracy expects the model outputs to be a tensor of scores (N, C) or labels (N,), or a dict holding "
                f"one; got {type(pred).__name__}"
            )
        target = torch.as_tensor(target).to(pred.device, non_blocking=True)
        if target.dim() == 2 and target.shape[1] == 1:
            target = target[:, 0]
        elif target.dim() == 2:
            target = target.argmax(dim=1)
        if target.dim() != 1 or target.shape[0] != pred.shape[0]:
            raise ValueError(
                f"Accuracy: target of shape {tuple(target.shape)} does not match predictions of shape "
                f"{tuple(pred.shape)}; expected targets of shape ({pred.shape[0]},)"
            )
        return pred, target

    def _target_rank(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Position of the target class in a stable descending sort of each row's scores."""
        if pred.dim() == 1:
            if max(self.topk) > 1:
                raise ValueError(
                    f"Accuracy(topk={self.topk}) needs class scores of shape (N, C), but the outputs are labels of "
                    f"shape {tuple(pred.shape)}; return logits or use topk=1"
                )
            return torch.where(pred == target, 0, _WRONG).to(torch.int64)
        if pred.dim() != 2:
            raise ValueError(
                "Accuracy expects scores of shape (N, C) or labels of shape (N,); got outputs of shape "
                f"{tuple(pred.shape)}"
            )
        num_classes = pred.shape[1]
        if max(self.topk) > num_classes:
            raise ValueError(
                f"Accuracy(topk={self.topk}) asks for top-{max(self.topk)} among only {num_classes} classes; use k <= "
                f"{num_classes}"
            )
        target = target.long()
        valid = (target >= 0) & (target < num_classes)
        score = pred.gather(1, target.clamp(0, num_classes - 1).unsqueeze(1))
        pred_nan, score_nan = pred.isnan(), score.isnan()
        before = torch.arange(num_classes, device=pred.device).unsqueeze(0) < target.unsqueeze(1)
        greater = (pred > score) | (pred_nan & ~score_nan)
        tied = (pred == score) | (pred_nan & score_nan)
        rank = greater.sum(dim=1) + (tied & before).sum(dim=1)
        return torch.where(valid, rank, _INVALID)


__all__ = ["Accuracy"]
