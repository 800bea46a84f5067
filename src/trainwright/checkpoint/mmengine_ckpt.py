"""mmengine's checkpoints read without running code from them, as plain data.

An mmengine checkpoint pickles a few objects besides tensors: its message hub's ``HistoryBuffer`` s (with numpy
arrays), numpy scalars in ``meta``, sometimes a ``ConfigDict``. torch's weights-only unpickler refuses them.
:func:`read_mmengine_checkpoint` runs that same unpickler with an allowlist of exactly these and turns them into plain
data.
"""

from __future__ import annotations

import importlib
import pickle
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainwright.checkpoint.io import (
    CheckpointError,
    MapLocation,
    PathLike,
    UnsafeCheckpointError,
    atomic_save,
    first_reason,
)

#: The module prefixes whose globals mark a refusal this reader may lift (mmengine's classes, the numpy inside them).
FOREIGN_PREFIXES = ("mmengine.", "numpy.")


class _HistoryBufferFields:
    """Stand-in for ``mmengine.logging.history_buffer.HistoryBuffer``: unpickling only sets its fields."""


def _allowlist() -> list[Any]:
    """What the weights-only unpickler may rebuild besides its defaults: mmengine's classes as stand-ins, numpy
    arrays, dtypes and scalars."""
    import numpy.dtypes

    core = importlib.import_module(
        "numpy._core.multiarray" if hasattr(np, "_core") else "numpy.core.multiarray"
    )  # numpy 2 / 1: where arrays are rebuilt
    allowed: list[Any] = [
        (_HistoryBufferFields, "mmengine.logging.history_buffer.HistoryBuffer"),
        (
            OrderedDict,
            "mmengine.config.config.ConfigDict",
        ),  # a dict subclass: rebuilt as the one dict type whose items and state the unpickler sets
        np.ndarray,
        np.dtype,
    ]
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):  # files written under numpy 1 and numpy 2
        allowed += [(core._reconstruct, f"{module}._reconstruct"), (core.scalar, f"{module}.scalar")]
    allowed += [getattr(numpy.dtypes, n) for n in dir(numpy.dtypes) if n.endswith("DType")]
    return allowed


def is_foreign_refusal(message: str) -> bool:
    """Whether torch's weights-only refusal ``message`` names an mmengine or numpy global (what
    :func:`read_mmengine_checkpoint` can read)."""
    return any(f"GLOBAL {prefix}" in message for prefix in FOREIGN_PREFIXES)


def read_mmengine_checkpoint(path: PathLike, map_location: MapLocation = "cpu") -> dict[str, Any]:
    """Load an mmengine checkpoint as plain data (tensors, numbers, strings, dicts, lists), running no code from the
    file.

    torch's weights-only unpickler runs with an allowlist of mmengine's classes: each is rebuilt as an inert stand-in
    (its fields set, none of its code run: mmengine need not be installed) and then turned into plain data. Anything
    else a file asks for (``os.system``, another class) is refused as it is by
    :func:`~trainwright.checkpoint.io.load_file`.

    A ``HistoryBuffer`` becomes ``{"log_history": tensor, "count_history": tensor, "max_length": int}``,
    a ``ConfigDict`` an ``OrderedDict``, a numpy array a tensor (a list when it holds objects or text), a numpy
    scalar a Python number.

    Raises:
        UnsafeCheckpointError: the file asks for another class or function (it is not read).
        CheckpointError: the file is truncated or not a checkpoint.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"Checkpoint file {str(p)!r} does not exist. Check the path.")
    try:
        with torch.serialization.safe_globals(_allowlist()):
            obj = torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(
            f"Refused to load checkpoint {str(p)!r} as an mmengine checkpoint: {first_reason(str(e)).rstrip('.')}. "
            "Only tensors, plain containers, "
            "numpy arrays and scalars, and mmengine's HistoryBuffer and ConfigDict are read; anything else could run "
            "code when unpickled."
        ) from None
    except (EOFError, RuntimeError, ValueError, OSError) as e:
        raise CheckpointError(
            f"Cannot read checkpoint {str(p)!r}: {type(e).__name__}: {e}. The file is truncated, corrupt or not a "
            "checkpoint."
        ) from e
    return plain_data(obj)  # type: ignore[no-any-return]


def plain_data(obj: Any) -> Any:
    """``obj`` with the stand-ins, numpy arrays and numpy scalars replaced by plain data (containers rebuilt, tensors
    kept)."""
    if isinstance(obj, _HistoryBufferFields):
        fields = vars(obj)
        return {
            "log_history": plain_data(fields.get("_log_history")),
            "count_history": plain_data(fields.get("_count_history")),
            "max_length": plain_data(fields.get("max_length")),
        }
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy()) if obj.dtype.kind in "biufc" else plain_data(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(
        obj, OrderedDict
    ):  # a state dict keeps its type and its _metadata (module versions); a ConfigDict's copied fields are dropped
        ordered = OrderedDict((k, plain_data(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            ordered._metadata = plain_data(obj._metadata)  # type: ignore[attr-defined]
        return ordered
    if isinstance(obj, Mapping):
        return {k: plain_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(plain_data(v) for v in obj)
    return obj


def convert_mmengine_checkpoint(src: PathLike, dst: PathLike) -> dict[str, Any]:
    """Write ``src`` (an mmengine checkpoint) to ``dst`` as plain data that ``torch.load(weights_only=True)`` reads;
    return what was written.

    Nothing from ``src`` is executed (see :func:`read_mmengine_checkpoint`); ``dst`` is written atomically.
    """
    ckpt = read_mmengine_checkpoint(src)
    if not isinstance(ckpt, Mapping):
        raise CheckpointError(f"{str(src)!r} holds a {type(ckpt).__name__}, not a checkpoint dict; nothing was written")
    atomic_save(ckpt, dst)
    return dict(ckpt)


__all__ = [
    "FOREIGN_PREFIXES",
    "convert_mmengine_checkpoint",
    "is_foreign_refusal",
    "plain_data",
    "read_mmengine_checkpoint",
]
