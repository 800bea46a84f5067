"""Reading a DCP checkpoint without running code from it.

``torch.distributed.checkpoint`` unpickles a directory's ``.metadata`` with :mod:`pickle` and each non-tensor entry
(an optimizer's ``param_groups``, a step count...) with ``torch.load(weights_only=False)``: a crafted directory would
run code when it is resumed, inspected or published. Here both are checked first: ``.metadata`` by an unpickler that
admits only DCP's metadata types and the torch values they hold, each entry by ``torch.load(weights_only=True)``; a
refusal is an :class:`~trainwright.checkpoint.io.UnsafeCheckpointError` naming what was asked for, and nothing of the
file was executed. Then torch's own reader and planner do the reading, unchanged.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

from trainwright.checkpoint.io import UnsafeCheckpointError, first_reason
from trainwright.checkpoint.storage import Location

METADATA = ".metadata"
#: Modules whose classes a ``.metadata`` pickle may name (DCP's metadata, storage info and planner types).
_DCP_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
)
#: Other globals a ``.metadata`` pickle may name: inert values and constructors of values.
_VALUES = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "Path"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("builtins", "complex"),
}
_FIX = (
    "The directory was not written by torch.distributed.checkpoint as trainwright writes it (or was altered); nothing "
    "from it was executed. Do not load it unless you trust its source"
)


class _Refused(pickle.UnpicklingError):
    """A global the metadata unpickler does not admit."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata``, admitting only the globals above (checked before any module is imported)."""

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        if module in _DCP_MODULES or (module, name) in _VALUES:
            found = super().find_class(module, name)
            if module not in _DCP_MODULES or isinstance(found, type):
                return found
        elif module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        ):
            return getattr(torch, name)
        raise _Refused(f"{module}.{name}")


def check_metadata(path: Location) -> None:
    """Refuse ``path``'s ``.metadata`` when it asks for anything but DCP's metadata types; a missing or corrupt one is
    left to torch's reader to report.

    Raises:
        UnsafeCheckpointError: the pickle names another global (the message names it).
    """
    try:
        data = (path / METADATA).read_bytes()
    except OSError:
        return
    try:
        _MetadataUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise UnsafeCheckpointError(
            f"Refused to read checkpoint {str(path)!r}: its {METADATA} asks for {e}, which DCP metadata never holds. "
            + _FIX
        ) from None
    except Exception:  # noqa: BLE001 - truncated or corrupt: torch's reader reports it as it always has
        return


def check_entry(path: Location, key: str, value: io.BytesIO) -> io.BytesIO:
    """``value`` (a non-tensor entry's bytes, as torch.save wrote them) rewound, once ``torch.load(weights_only=True)``
    reads it.

    Raises:
        UnsafeCheckpointError: the safe loader refuses it (the message names the entry).
    """
    data = value.read()
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(
            f"Refused to read checkpoint {str(path)!r}: its entry {key!r} {first_reason(str(e)).rstrip('.')}. " + _FIX
        ) from None
    return io.BytesIO(data)


def safe_reader(base: type, path: Location, *args: Any, **kwargs: Any) -> Any:
    """An instance of DCP's storage reader ``base`` for ``path`` whose ``read_metadata`` checks ``.metadata`` first."""

    class SafeReader(base):  # type: ignore[misc,valid-type]
        def read_metadata(self, *a: Any, **k: Any) -> Any:
            check_metadata(path)
            return super().read_metadata(*a, **k)

    return SafeReader(*args, **kwargs)


def safe_planner(base: type, path: Location, **kwargs: Any) -> Any:
    """An instance of the DCP load planner ``base`` (given ``kwargs``) whose ``load_bytes`` admits only what the safe
    loader reads."""

    class SafePlanner(base):  # type: ignore[misc,valid-type]
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            super().load_bytes(read_item, check_entry(path, str(read_item.dest_index.fqn), value))

    return SafePlanner(**kwargs)


def refusal_in(e: BaseException) -> UnsafeCheckpointError | None:
    """The :class:`UnsafeCheckpointError` DCP wrapped into ``e`` (its per-rank ``failures``, or a cause), if any."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, UnsafeCheckpointError):
            return seen
        for failure in getattr(seen, "failures", {}).values():
            found = refusal_in(failure[0] if isinstance(failure, tuple) else failure)
            if found is not None:
                return found
        seen = seen.__cause__ or seen.__context__
    return None
