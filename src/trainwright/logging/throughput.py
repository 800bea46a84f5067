"""How many samples and tokens a batch holds: what the throughput fields of log records count.

Read from the loader's batch at logging iterations only: samples by :func:`batch_size`, tokens
by :func:`tokens_counter` (the model's ``count_tokens`` or :func:`num_tokens`). Nothing found:
no ``samples_per_s`` / ``tokens_per_s`` field (see docs/logging.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def batch_size(batch: Any) -> int | None:
    """The number of samples in ``batch``, or None when it cannot be told.

    A tensor: its first dimension; a dict: an int ``"batch_size"``, else its first tensor (first
    dimension) or list / tuple value (length); a list / tuple: the first dimension of its first
    tensor, else its length.
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, (list, tuple)):  # before Mapping: the default collate's batch, and no ABC check for it
        for v in batch:
            if isinstance(v, torch.Tensor) and v.dim():
                return int(v.shape[0])
        return len(batch) or None
    if isinstance(batch, Mapping):
        n = batch.get("batch_size")
        if isinstance(n, int) and not isinstance(n, bool):
            return n
        for v in batch.values():
            if isinstance(v, torch.Tensor) and v.dim():
                return int(v.shape[0])
            if isinstance(v, (list, tuple)):
                return len(v)
        return None
    return None


def num_tokens(batch: Any) -> Any:
    """The number of tokens in a dict ``batch`` (a number, or a 0-dim tensor read later), or None when it does not say.

    Its ``"num_tokens"`` (number or 0-dim tensor), else the non-zero entries of
    ``"attention_mask"``, else the elements of ``"input_ids"``.

    A tensor count is returned as a tensor so the caller converts it when it reads the other
    logged numbers (no extra host-device synchronisation).
    """
    if isinstance(batch, (list, tuple)) or not isinstance(
        batch, Mapping
    ):  # a list / tuple first: no ABC check for the usual batch
        return None
    n = batch.get("num_tokens")
    if n is not None:
        return n
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return torch.count_nonzero(mask)
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor):
        return ids.numel()
    return None


def tokens_counter(model: Any) -> Callable[[Any], Any]:
    """How the logger counts a batch's tokens: ``model.count_tokens`` when the model defines it, else
    :func:`num_tokens`.

    A model declares its tokens per batch with a method ``count_tokens(self, data_batch)``
    that returns the number of tokens the batch feeds it (an int, a 0-dim tensor - read when
    the line's other numbers are - or None for "unknown"); ``data_batch`` is the batch as the
    loader yields it. It is called at logging iterations only. E.g. a language model over
    ``(ids, targets)`` batches: ``return data_batch[0].numel()``.
    """
    count = getattr(model, "count_tokens", None)
    return count if callable(count) else num_tokens
