"""Where a metric finds the predictions and the target of a batch (shared by the stock metrics and adapters)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

TARGET_KEYS = ("label", "labels", "target", "targets", "y")
PRED_KEYS = ("pred", "preds", "logits", "scores")


def pred_and_target(data_batch: Any, outputs: Any, target_key: str | None, who: str) -> tuple[Any, Any]:
    """``(predictions, target)`` of one batch, as the model and the loader gave them.

    The predictions: ``outputs`` itself, or from a dict ``outputs`` its ``"pred"``, ``"preds"``,
    ``"logits"`` or ``"scores"``. The target: from a dict ``outputs`` when it holds a target
    key, else from ``data_batch``: its last element for a tuple / list batch; for a dict batch
    the entry ``target_key``, or the first of ``"label"``, ``"labels"``, ``"target"``,
    ``"targets"``, ``"y"``, else ``"data_samples"`` when it is a tensor (mmengine's name for
    what goes with the ``"inputs"``; its data-sample objects are not read).

    Args:
        data_batch: The batch as the data loader yielded it.
        outputs: What ``val_step`` / ``test_step`` returned for it.
        target_key: Name of the target when it is none of the default names.
        who: The metric's name, for the error messages.

    Raises:
        KeyError / TypeError: predictions or target not found (the message names where it looked and the fix).
    """
    target: Any = None
    target_keys = (target_key,) if target_key is not None else TARGET_KEYS
    if isinstance(outputs, Mapping):
        pred = first(outputs, PRED_KEYS)
        if pred is None:
            raise KeyError(
                f"{who} needs the predictions in one of the output keys {PRED_KEYS}; got keys {sorted(outputs)}. "
                "Return them as outputs['pred'] or pass a tensor."
            )
        target = first(outputs, target_keys)
    else:
        pred = outputs
    if target is None:
        if isinstance(data_batch, Mapping):
            target = first(data_batch, target_keys)
            if target is None and target_key is None and isinstance(data_batch.get("data_samples"), torch.Tensor):
                target = data_batch[
                    "data_samples"
                ]  # mmengine's name for what goes with the inputs: a tensor of targets here
            if target is None:
                raise KeyError(
                    f"{who} found no target in the batch keys {sorted(data_batch)} (looked for {tuple(target_keys)}"
                    f"{', and a tensor in data_samples' if target_key is None else ''}); pass {who}(target_key=...) "
                    "naming it."
                )
        elif isinstance(data_batch, (list, tuple)) and len(data_batch) > 0:
            target = data_batch[-1]
        else:
            raise TypeError(
                f"{who} takes the target from a tuple/list batch (last element) or a dict batch; got "
                f"{type(data_batch).__name__}. Return the target in outputs['label'] instead."
            )
    return pred, target


def first(mapping: Mapping[str, Any], keys: Sequence[str]) -> Any:
    """The value of the first of ``keys`` that ``mapping`` holds, or None."""
    for key in keys:
        if key in mapping:
            return mapping[key]
    return None
