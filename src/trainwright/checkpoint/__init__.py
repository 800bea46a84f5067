"""Checkpoint files and state: the Stateful protocol, atomic writes, safe loading, a folder's checkpoints, weights,
RNG state."""

from typing import TYPE_CHECKING, Any

from trainwright.checkpoint.io import (
    CheckpointError,
    UnsafeCheckpointError,
    atomic_save,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    load_file,
    read_safetensors,
)
from trainwright.checkpoint.listing import LATEST_FILENAME, find_resumable, list_checkpoints, read_latest, write_latest
from trainwright.checkpoint.lock import WorkDirBusyError, WorkDirLock
from trainwright.checkpoint.rng import get_rng_state, set_rng_state
from trainwright.checkpoint.stateful import Stateful, check_state_dict
from trainwright.checkpoint.weights import (
    DEFAULT_REVISE_KEYS,
    IncompatibleKeys,
    extract_state_dict,
    load_model_weights,
    load_safetensors,
    revise_state_dict_keys,
    save_safetensors,
)

if TYPE_CHECKING:
    from trainwright.checkpoint.export import export_safetensors, load_exported, read_exported

#: Loaded on first use (PEP 562): a run that exports nothing does not keep the safetensors export's code.
_LAZY = {"export_safetensors", "load_exported", "read_exported"}


def __getattr__(name: str) -> Any:
    """Import a lazily loaded public name (:data:`_LAZY`) the first time it is asked for."""
    if name in _LAZY:
        from trainwright.checkpoint import export

        value = getattr(export, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_REVISE_KEYS",
    "LATEST_FILENAME",
    "CheckpointError",
    "Stateful",
    "IncompatibleKeys",
    "UnsafeCheckpointError",
    "WorkDirBusyError",
    "WorkDirLock",
    "atomic_save",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_state_dict",
    "export_safetensors",
    "extract_state_dict",
    "find_resumable",
    "get_rng_state",
    "list_checkpoints",
    "load_exported",
    "load_file",
    "load_model_weights",
    "load_safetensors",
    "read_exported",
    "read_latest",
    "read_safetensors",
    "revise_state_dict_keys",
    "save_safetensors",
    "set_rng_state",
    "write_latest",
]
