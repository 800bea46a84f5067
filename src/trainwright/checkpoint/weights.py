"""Model weights: loading a state dict with clear errors, and safetensors export.

``load_model_weights`` checks everything before it copies anything, so a failed load leaves
the model as it was: a shape mismatch is always an error (even with ``strict=False``), and
missing and unexpected keys are listed by name (see docs/checkpoints.md).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from trainwright.checkpoint.io import PathLike, atomic_write_bytes, read_safetensors

DEFAULT_REVISE_KEYS: tuple[tuple[str, str], ...] = ((r"^module\.", ""),)
"""Strip the ``module.`` prefix that ``DataParallel`` / ``DistributedDataParallel`` add."""


class IncompatibleKeys(NamedTuple):
    """Keys that did not line up between a checkpoint and a model."""

    missing_keys: list[str]
    """Keys the model has and the checkpoint lacks (left at their current values)."""
    unexpected_keys: list[str]
    """Keys the checkpoint has and the model lacks (ignored)."""


def revise_state_dict_keys(
    state_dict: Mapping[str, Any], revise_keys: Sequence[tuple[str, str]] = DEFAULT_REVISE_KEYS
) -> dict[str, Any]:
    """Rename the keys of ``state_dict`` by regex substitutions, applied in order.

    Args:
        state_dict: The weights to rename (not modified).
        revise_keys: ``(pattern, replacement)`` pairs for ``re.sub``; the default strips a
            leading ``module.``.

    Returns:
        A new dict with the renamed keys, in the original order.

    Raises:
        ValueError: two keys end up with the same name (the rules would lose a tensor).
    """
    rules = [(re.compile(pattern), repl) for pattern, repl in revise_keys]
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in state_dict.items():
        new = key
        for rx, repl in rules:
            new = rx.sub(repl, new)
        if new in out:
            raise ValueError(
                f"revise_keys maps both {origin[new]!r} and {key!r} to {new!r}; "
                "change revise_keys so that every key keeps a unique name."
            )
        out[new] = value
        origin[new] = key
    return out


def _is_tensor_mapping(obj: Any) -> bool:
    return isinstance(obj, Mapping) and all(
        isinstance(v, torch.Tensor) or str(k).endswith("_extra_state") for k, v in obj.items()
    )


def extract_state_dict(checkpoint: Mapping[str, Any]) -> Mapping[str, Any]:
    """Find the model weights in a checkpoint dict.

    Rules, in order: a ``"model"`` entry that is a mapping of tensors (trainwright's own
    checkpoints); else a ``"state_dict"`` entry that is a mapping (mmengine / Lightning
    checkpoints); else ``checkpoint`` itself is the state dict.
    """
    model = checkpoint.get("model")
    if _is_tensor_mapping(model):
        return model  # type: ignore[return-value]
    state = checkpoint.get("state_dict")
    if isinstance(state, Mapping):
        return state
    return checkpoint


def load_model_weights(
    model: nn.Module,
    state_dict: Mapping[str, Any],
    strict: bool = False,
    revise_keys: Sequence[tuple[str, str]] = DEFAULT_REVISE_KEYS,
    load: Callable[[dict[str, Any]], Any] | None = None,
) -> IncompatibleKeys:
    """Copy weights into ``model``, checking first so that a failed load changes nothing.

    A shape mismatch names every mismatched key with the checkpoint shape and the model
    shape, in torch's wording. Missing and unexpected keys are an error with ``strict=True``,
    one warning otherwise.

    Args:
        model: The (unwrapped) module to load into.
        state_dict: Its weights, or a checkpoint dict holding them under ``"model"`` or
            ``"state_dict"`` (see :func:`extract_state_dict`).
        strict: Whether missing or unexpected keys are an error (they are always listed).
        revise_keys: Key renames applied first (see :func:`revise_state_dict_keys`).
        load: What copies the checked (full) weights into the model; default
            ``model.load_state_dict(weights, strict=False)``. A sharded model needs its
            strategy's loader (``Trainer.load_weights`` passes it).

    Returns:
        The missing and unexpected keys.

    Raises:
        RuntimeError: shapes differ (whatever ``strict`` says), or ``strict`` and keys
            are missing or unexpected. The message names every offending key.
    """
    weights = revise_state_dict_keys(extract_state_dict(state_dict), revise_keys)
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    mismatched = [
        f"size mismatch for {k}: copying a param with shape {v.shape} from checkpoint, "
        f"the shape in current model is {own[k].shape}."
        for k, v in weights.items()
        if k in own and isinstance(v, torch.Tensor) and isinstance(own[k], torch.Tensor) and v.shape != own[k].shape
    ]
    problems = list(mismatched)
    if strict and unexpected:
        problems.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ".")
    if strict and missing:
        problems.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ".")
    if problems:
        hint = (
            "Shapes must match whatever `strict` says: load a checkpoint made for this model "
            "configuration, or drop/rename those keys (revise_keys) before loading."
            if mismatched
            else "Pass strict=False to load the keys that match, or fix the names with revise_keys "
            "(e.g. [(r'^backbone\\.', '')])."
        )
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(model).__name__}:\n\t" + "\n\t".join(problems) + f"\n{hint}"
        )
    if missing or unexpected:
        warnings.warn(
            f"Loading weights into {type(model).__name__} with strict=False: "
            f"missing keys (kept as initialised): {missing}; unexpected keys (ignored): {unexpected}.",
            stacklevel=2,
        )
    if load is not None:
        load(weights)
    else:
        model.load_state_dict(weights, strict=False)
    return IncompatibleKeys(missing_keys=missing, unexpected_keys=unexpected)


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def _plain_tensors(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors that own their storage (what safetensors accepts)."""
    shared: dict[tuple[str, int], int] = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"safetensors can only store tensors, but {key!r} is a {type(value).__name__}; "
                "save that entry with atomic_save (torch.save) instead, or drop it."
            )
        if value.numel():
            sk = _storage_key(value)
            shared[sk] = shared.get(sk, 0) + 1
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        t = value.detach()
        whole = t.numel() * t.element_size() == t.untyped_storage().nbytes()
        if t.numel() and (shared[_storage_key(t)] > 1 or not whole):
            t = t.clone()  # tied weights or a view of a larger storage: give it its own
        out[key] = t.to("cpu").contiguous()
    return out


def save_safetensors(
    state_dict_or_module: Mapping[str, torch.Tensor] | nn.Module,
    path: PathLike,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Export weights as a safetensors file, atomically.

    Tensors are moved to CPU and made contiguous; tensors that share storage (tied
    weights, e.g. an embedding and an output layer) are stored as separate copies, since
    safetensors refuses shared storage. Loading them back into a model with the same ties
    restores the tie, because both keys carry the same values.

    Args:
        state_dict_or_module: A module (its ``state_dict()`` is saved) or a mapping of tensors.
        path: The target file (conventionally ``*.safetensors``).
        metadata: Optional string-to-string metadata stored in the file header.
    """
    from safetensors.torch import save as st_save

    state = state_dict_or_module.state_dict() if isinstance(state_dict_or_module, nn.Module) else state_dict_or_module
    data = st_save(_plain_tensors(state), metadata=dict(metadata) if metadata else None)
    atomic_write_bytes(path, data)


def load_safetensors(path: PathLike) -> dict[str, torch.Tensor]:
    """Load a safetensors file (whatever its suffix) into a dict of CPU tensors; no code can run.

    Raises:
        FileNotFoundError: ``path`` does not exist (the message names it).
        CheckpointError: the file is truncated or corrupt.
    """
    return read_safetensors(path)
