"""The Stateful protocol: anything a checkpoint saves and restores by name.

A checkpoint is ``{name: piece.state_dict()}`` over one mapping of named pieces (model,
optimizer, schedulers, progress, hooks, RNG, user objects...); resume calls
``piece.load_state_dict(checkpoint[name])``. This is torchtnt's ``Stateful`` (the shape
``torch.distributed.checkpoint`` expects). A piece may define ``check_state_dict(state)``,
raising with what does not match and how to fix it: resume checks every piece before it
loads any. :func:`make_safe` checks a finished checkpoint dict before it is written.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch


@runtime_checkable
class Stateful(Protocol):
    """An object whose state is saved with ``state_dict()`` and restored with ``load_state_dict()``.

    The state must hold only tensors and plain containers (dict, list, tuple, str, numbers,
    bool, None; NumPy values are converted when the checkpoint is written) so that the
    checkpoint loads with ``torch.load(weights_only=True)``.
    """

    def state_dict(self) -> dict[str, Any]:
        """Return the state to save."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state returned by :meth:`state_dict`."""
        ...


class PieceNotReady(RuntimeError):
    """Raised by a piece's ``check_state_dict`` when it cannot take a state yet (e.g. the model is not prepared)."""


def check_state_dict(piece: Any, state: Any) -> None:
    """Run ``piece.check_state_dict(state)`` if the piece defines it (see the module docstring)."""
    check = getattr(piece, "check_state_dict", None)
    if callable(check):
        check(state)


_PLAIN = (str, int, float, bool, bytes, type(None), torch.dtype, torch.device, torch.Size)


def _is_plain(obj: Any) -> bool:
    # exact types: an IntEnum or a str subclass pickles as its class, which the safe loader refuses
    return type(obj) in _PLAIN


def _is_leaf(obj: Any) -> bool:
    """A value :func:`make_safe` returns unchanged without looking inside: a tensor or a plain scalar."""
    return type(obj) in _PLAIN or isinstance(obj, torch.Tensor)


def make_safe(obj: Any, where: str = "checkpoint") -> Any:
    """Return ``obj`` with NumPy values converted; raise if it would not load with ``weights_only=True``.

    Args:
        obj: A checkpoint (or any part of one).
        where: The key path of ``obj``, for the error message.

    Returns:
        ``obj``, or a copy of the containers that held NumPy values.

    Raises:
        TypeError: ``obj`` holds an object the safe loader refuses (names its key path).
    """
    if isinstance(obj, torch.Tensor) or _is_plain(obj):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, Mapping):
        # a leaf is checked here, so its key path (an f-string) is only built for containers: a save visits every value
        pairs = [(k, v, v if _is_leaf(v) else make_safe(v, f"{where}[{k!r}]")) for k, v in obj.items()]
        for k, _, _ in pairs:
            if not _is_plain(k):
                raise TypeError(
                    f"{where} has a key of type {type(k).__name__} ({k!r}); checkpoint dict keys must be strings or "
                    "numbers"
                )
        if all(new is old for _, old, new in pairs) and type(obj) in (dict, OrderedDict):
            return obj  # unchanged: keep the object (and e.g. a state dict's _metadata)
        return (
            OrderedDict((k, new) for k, _, new in pairs)
            if isinstance(obj, OrderedDict)
            else {k: new for k, _, new in pairs}
        )
    if isinstance(obj, (list, tuple)):
        if type(obj) in (list, tuple) and all(_is_leaf(v) for v in obj):
            return obj  # e.g. Python's random state: 625 ints, each already safe
        items = [v if _is_leaf(v) else make_safe(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if all(a is b for a, b in zip(items, obj)) and type(obj) in (list, tuple):
            return obj
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, (set, frozenset)) and all(_is_plain(v) for v in obj):
        return obj if type(obj) is set else set(obj)  # the safe loader rebuilds sets, not frozensets (nor subclasses)
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, which a checkpoint cannot hold: "
        "checkpoints are loaded with torch.load(weights_only=True), which only rebuilds tensors and plain "
        "containers. Make the state_dict() that returns it store tensors, numbers, strings, lists and dicts instead."
    )
