"""Hugging Face-style safetensors folders of a model's weights: written whole (atomically), tied weights once.

A folder holds ``model.safetensors`` (or, above ``max_shard_bytes``, ``model-00001-of-0000N.safetensors`` ... with
``model.safetensors.index.json``: ``{"metadata": {"total_size": ...}, "weight_map": {name: file}}``) and the model's
``config.json`` where it has one. safetensors refuses tensors that share storage: of tied parameters (an embedding
and an output layer holding one tensor) the first name is stored and the others are recorded as its aliases in the
files' metadata (``"tied": {"alias": "stored name"}``, JSON); :func:`read_exported` gives the aliases the stored
tensor back (one tensor, tied), and :func:`load_exported` loads the folder into a model.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainwright.checkpoint.durability import fsync_dir
from trainwright.checkpoint.io import PathLike, atomic_write_bytes
from trainwright.checkpoint.weights import IncompatibleKeys, load_model_weights

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
#: The metadata key (in every safetensors file and the index) holding ``{alias: stored name}`` as JSON.
TIED_KEY = "tied"
#: Hugging Face's default shard size (``max_shard_size="5GB"``).
DEFAULT_SHARD_BYTES = 5 * 10**9


def _view_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Tensors with equal keys are one tensor (tied): the same storage, offset, shape, strides and dtype."""
    return (str(t.device), t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def split_tied(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``state`` without the tied duplicates, and ``{alias: stored name}`` (the first name of each tied group is
    stored).

    Raises:
        TypeError: a value is not a tensor (safetensors stores tensors only).
    """
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"safetensors can only store tensors, but {name!r} is a {type(value).__name__}; leave it out of the "
                "exported state"
            )
        key = _view_key(value)
        if value.numel() and key in first:
            aliases[name] = first[key]
        else:
            first.setdefault(key, name)
            stored[name] = value
    return stored, aliases


def _owned(t: torch.Tensor) -> torch.Tensor:
    """A detached contiguous CPU tensor that owns its whole storage (what safetensors accepts)."""
    t = t.detach().to("cpu")
    if not t.is_contiguous() or t.numel() * t.element_size() != t.untyped_storage().nbytes():
        t = t.contiguous().clone()
    return t


def _shards(tensors: Mapping[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    """Names in order, cut into groups of at most ``max_bytes`` (a tensor larger than that gets a group of its own)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if groups[-1] and size + n > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += n
    return groups


def config_json(model: Any) -> str | None:
    """The JSON of ``model.config`` where it is a Hugging Face config (``to_json_string()`` / ``to_dict()``) or a
    dict; None otherwise."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    if callable(getattr(config, "to_json_string", None)):
        return str(config.to_json_string())
    if callable(getattr(config, "to_dict", None)):
        return json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n"
    if isinstance(config, Mapping):
        return json.dumps(dict(config), indent=2, sort_keys=True) + "\n"
    return None


def write_exported(
    stored: Mapping[str, torch.Tensor],
    folder: PathLike,
    *,
    aliases: Mapping[str, str] | None = None,
    config: str | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Write ``stored`` (tensors that share no storage, see :func:`split_tied`) as the folder ``folder``, whole.

    The files go into a temporary folder beside it, each fsynced, which is renamed onto ``folder`` (an older folder
    of that name is replaced): a reader sees no folder or a complete one.

    Args:
        stored: Name -> tensor.
        folder: The target folder.
        aliases: ``{alias: stored name}`` of tied tensors (recorded in the metadata).
        config: The model's ``config.json`` text (None: none).
        max_shard_bytes: Above this, the weights are sharded with an index.

    Returns:
        ``folder``.
    """
    from safetensors.torch import save as st_save

    target = Path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.mkdir()
    try:
        tensors = {k: _owned(v) for k, v in stored.items()}
        meta = {"format": "pt", TIED_KEY: json.dumps(dict(aliases or {}), sort_keys=True)}
        groups = _shards(tensors, max_shard_bytes)
        files = (
            [WEIGHTS_NAME]
            if len(groups) == 1
            else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
        )
        for names, file in zip(groups, files):
            atomic_write_bytes(tmp / file, st_save({k: tensors[k] for k in names}, metadata=meta))
        if len(groups) > 1:
            index = {
                "metadata": {
                    "total_size": sum(t.numel() * t.element_size() for t in tensors.values()),
                    TIED_KEY: dict(aliases or {}),
                },
                "weight_map": {k: file for names, file in zip(groups, files) for k in names},
            }
            atomic_write_bytes(tmp / INDEX_NAME, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
        if config is not None:
            atomic_write_bytes(tmp / CONFIG_NAME, config.encode("utf-8"))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def export_safetensors(
    state_dict_or_module: Mapping[str, torch.Tensor] | nn.Module,
    folder: PathLike,
    *,
    config: str | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Export weights as a Hugging Face-style folder (see the module), tied tensors once; a module's ``config.json``
    too (:func:`config_json`) unless ``config`` is given."""
    if isinstance(state_dict_or_module, nn.Module):
        config = config if config is not None else config_json(state_dict_or_module)
        state: Mapping[str, Any] = state_dict_or_module.state_dict()
    else:
        state = state_dict_or_module
    stored, aliases = split_tied(state)
    return write_exported(stored, folder, aliases=aliases, config=config, max_shard_bytes=max_shard_bytes)


def read_exported(folder: PathLike) -> dict[str, torch.Tensor]:
    """The weights of an exported folder, tied names given the one stored tensor (``d[alias] is d[stored]``).

    Raises:
        FileNotFoundError: ``folder`` holds neither ``model.safetensors`` nor an index.
        CheckpointError: a file is truncated or corrupt.
    """
    from safetensors import safe_open

    from trainwright.checkpoint.io import read_safetensors

    d = Path(folder)
    if (d / INDEX_NAME).is_file():
        index = json.loads((d / INDEX_NAME).read_text())
        files = list(dict.fromkeys(index["weight_map"].values()))
    elif (d / WEIGHTS_NAME).is_file():
        files = [WEIGHTS_NAME]
    else:
        raise FileNotFoundError(
            f"{d} holds no {WEIGHTS_NAME} nor {INDEX_NAME}: not an exported weights folder (SafetensorsExportHook "
            "writes them under work_dir/<experiment>/exports/<iter_N>)"
        )
    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for file in files:
        out.update(read_safetensors(d / file))
        with safe_open(str(d / file), framework="pt") as f:
            aliases.update(json.loads((f.metadata() or {}).get(TIED_KEY, "{}")))
    for alias, name in aliases.items():
        out[alias] = out[name]
    return out


def load_exported(model: nn.Module, folder: PathLike, strict: bool = True) -> IncompatibleKeys:
    """Load an exported folder into ``model`` (see :func:`~trainwright.checkpoint.load_model_weights`: checked first,
    nothing copied on a mismatch); tied parameters of ``model`` stay tied."""
    return load_model_weights(model, read_exported(folder), strict=strict)
