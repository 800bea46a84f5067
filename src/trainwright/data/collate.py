"""Collate functions by name: torch's ``default_collate`` and mmengine's ``pseudo_collate``.

``FUNCTIONS`` (mmengine's registry of plain functions) holds both, so a config's
``collate_fn=dict(type='pseudo_collate')`` (or any function registered there, with keyword
arguments bound) builds the loader's collate function.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch.utils.data import default_collate

from trainwright.registry import FUNCTIONS


def pseudo_collate(data_batch: Sequence[Any]) -> Any:
    """Transpose a list of samples without stacking (mmengine's default collate function).

    A list of dicts becomes a dict of lists, a list of tuples a list of lists (named tuples
    keep their type), and tensors, numbers and strings stay a list of the samples' values:
    the model's data preprocessor decides how to stack them.

    Raises:
        RuntimeError: the samples are sequences of different lengths.
    """
    first = data_batch[0]
    if isinstance(first, (str, bytes)):
        return list(data_batch) if not isinstance(data_batch, list) else data_batch
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(pseudo_collate(samples) for samples in zip(*data_batch)))
    if isinstance(first, Sequence):
        size = len(first)
        if any(len(sample) != size for sample in data_batch):
            raise RuntimeError(
                "pseudo_collate: every sample of a batch must have the same length; got lengths "
                f"{[len(s) for s in data_batch]}"
            )
        columns = [pseudo_collate(samples) for samples in zip(*data_batch)]
        if isinstance(first, tuple):
            return columns
        try:
            return type(first)(columns)  # type: ignore[call-arg]
        except TypeError:
            return columns
    if isinstance(first, Mapping):
        return type(first)({key: pseudo_collate([sample[key] for sample in data_batch]) for key in first})  # type: ignore[call-arg]
    return data_batch


def pseudo_collate_hint(error: BaseException, loaders: Iterable[Any]) -> str:
    """What to change when ``error`` looks like a model given :func:`pseudo_collate`'s lists for tensors ('' otherwise).

    A dataloader configured mmengine-style (``sampler=dict(type='DefaultSampler')``) collates
    with :func:`pseudo_collate`, as mmengine's Runner does; a model written for stacked tensors
    then fails with a ``TypeError`` about a list or tuple, which names neither cause nor fix.
    """
    if not isinstance(error, TypeError) or not any(word in str(error) for word in ("list", "tuple")):
        return ""
    for loader in loaders:
        fn = getattr(getattr(loader, "loader", loader), "collate_fn", None)
        if getattr(fn, "func", fn) is pseudo_collate:
            return (
                "the batch came from pseudo_collate, mmengine's collate of a dataloader configured mmengine-style, "
                "which keeps a "
                "batch's samples as lists: stack them in the model's data_preprocessor, or give the dataloader "
                "collate_fn=dict(type='default_collate')"
            )
    return ""


FUNCTIONS.register(pseudo_collate, name="pseudo_collate")
FUNCTIONS.register(default_collate, name="default_collate")

__all__ = ["default_collate", "pseudo_collate", "pseudo_collate_hint"]
