"""Checkpoint directories written with ``torch.distributed.checkpoint`` (DCP): the I/O of sharded strategies.

A sharded checkpoint (``iter_8.dcp/``) holds the DCP files (every rank's shards and ``.metadata``)
and ``trainer_state.pth`` (everything else, written by rank 0). Complete or absent: ranks write
into a hidden temporary directory that rank 0 renames onto the target (:func:`publish`); a remote
one is written in place and is incomplete without ``.metadata``. Layout, resume: docs/checkpoints.md.
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
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner

from trainwright.checkpoint import storage
from trainwright.checkpoint.io import CheckpointError, UnsafeCheckpointError, fsync_dir, load_file
from trainwright.checkpoint.storage import Location, RemotePath, fsspec_store, location
from trainwright.dist.shards import is_sharded
from trainwright.dist.utils import get_rank, get_world_size
from trainwright.strategies.dcp_safe import check_metadata, refusal_in, safe_planner, safe_reader

TRAINER_STATE = "trainer_state.pth"
"""The file of a checkpoint directory that holds the trainer's non-sharded state."""
METADATA = ".metadata"


def is_dcp_checkpoint(path: str | os.PathLike[str] | RemotePath) -> bool:
    """True when ``path`` is a directory written by DCP (it has a ``.metadata`` file)."""
    return (location(path) / METADATA).is_file()


def storage_writer(path: Location) -> Any:
    """DCP's writer for ``path``: ``FileSystemWriter`` (local), ``FsspecWriter`` with the store's options (remote)."""
    if isinstance(path, RemotePath):
        from torch.distributed.checkpoint._fsspec_filesystem import (
            FsspecWriter,
        )  # not re-exported by torch.distributed.checkpoint

        return FsspecWriter(
            path.url, sync_files=False, **fsspec_store(path).options
        )  # an object store's PUT is durable; there is no fsync
    return dcp.FileSystemWriter(str(path))


def storage_reader(path: Location) -> Any:
    """DCP's reader for ``path`` (see :func:`storage_writer`); its ``.metadata`` is checked before torch unpickles it
    (:mod:`trainwright.strategies.dcp_safe`)."""
    if isinstance(path, RemotePath):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return safe_reader(FsspecReader, path, path.url, **fsspec_store(path).options)
    return safe_reader(dcp.FileSystemReader, path, str(path))


def temp_dir(target: Path, token: str) -> Path:
    """The hidden temporary name of ``target`` while it is written (matches the stale-file cleaner's pattern)."""
    return target.with_name(f".{target.name}.tmp.{os.getpid()}.{token}")


def new_token() -> str:
    """A random suffix for a temporary directory (rank 0 draws it, every rank uses it)."""
    return secrets.token_hex(4)


def publish(tmp: Path, target: Path) -> None:
    """Rename the complete directory ``tmp`` onto ``target`` (replacing an older one), then fsync the parent.

    POSIX cannot rename a directory onto a non-empty one: an existing ``target`` is first
    renamed aside and deleted after the new one is in place, so a kill between the two
    renames leaves a complete directory under a hidden name, never a torn one.
    """
    old = None
    if target.exists():
        old = temp_dir(target, new_token())
        os.replace(target, old)
    os.replace(tmp, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_shards(sharded: Mapping[str, Any], tmp: Location, target: Location, **save_kwargs: Any) -> None:
    """``dcp.save`` the shards into the temporary directory ``tmp`` of ``target`` (every rank); a failed write is an
    OSError.

    DCP reports a failed shard write on every rank as its ``CheckpointException`` (a
    ``BaseException``, its message a pasted traceback). Here it becomes an ``OSError`` naming
    ``target`` and the first failure, raised on every rank alike; the temporary directory is
    removed (rank 0, or the one process) and nothing was replaced. A remote ``tmp`` is the
    target itself (written in place; without ``.metadata`` it is incomplete).

    Raises:
        OSError: a shard could not be written (a full or read-only disk, a missing directory...).
    """
    try:
        dcp.save(sharded, storage_writer=storage_writer(tmp), **save_kwargs)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - CheckpointException is a BaseException
        first = str(e).strip().splitlines()
        cause = next(
            (line.strip() for line in reversed(first) if "Error" in line),
            first[-1].strip() if first else type(e).__name__,
        )
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            try:
                remove(tmp)
            except Exception:  # noqa: BLE001 - a store that went away: the partial folder has no .metadata, resume skips it
                pass
        raise OSError(
            f"Cannot write checkpoint {str(target)!r}: writing its shards failed ({type(e).__name__}: {cause[:300]}). "
            "Nothing was replaced: "
            f"{target.name} and `latest` are as they were before this save. Check the free space and permissions of "
            f"{str(target.parent)!r}"
            + (" (and that its storage endpoint is reachable)." if isinstance(target, RemotePath) else ".")
        ) from e


def remove(path: Location) -> None:
    """Delete a checkpoint: a directory with its files, or a file; a missing one is fine
    (:func:`trainwright.checkpoint.storage.remove`)."""
    storage.remove(path)


def saved_shapes(path: Location, prefix: str) -> dict[str, tuple[int, ...]]:
    """``{key: global shape}`` of the tensors stored under ``prefix`` (e.g. ``"model."``), from the DCP metadata.

    Raises:
        CheckpointError: the metadata is missing or unreadable.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        meta = storage_reader(path).read_metadata()
    except UnsafeCheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to read the index means the directory is unusable
        raise CheckpointError(
            f"Cannot read checkpoint {str(path)!r}: its DCP metadata is missing or corrupt ({type(e).__name__}: {e}). "
            "Resume from the previous checkpoint (delete or move this directory, or point `resume=` at an older one)."
        ) from e
    return {
        k[len(prefix) :]: tuple(v.size)
        for k, v in meta.state_dict_metadata.items()
        if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)
    }


def read_trainer_state(path: Location) -> dict[str, Any]:
    """The ``trainer_state.pth`` of a checkpoint directory (safe loader; CheckpointError when missing or corrupt)."""
    try:
        return load_file(path / TRAINER_STATE)
    except FileNotFoundError as e:
        raise CheckpointError(
            f"Cannot read checkpoint {str(path)!r}: it has no {TRAINER_STATE} (an incomplete copy?). "
            "Resume from the previous checkpoint (delete or move this directory, or point `resume=` at an older one)."
        ) from e


def load_into(path: Location, template: dict[str, Any], *, everything: bool = False) -> None:
    """``dcp.load`` the tensors of ``template`` (its own shards on each rank) in place; CheckpointError when the files
    are broken.

    ``everything``: read every entry of the checkpoint into the empty ``template``, as full
    tensors, in this process alone (what ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``
    does, through the same planner).
    """
    check_metadata(path)  # here too: DCP's loader reports a failed metadata read as an AssertionError's text
    try:
        if everything:
            from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

            _load_state_dict(
                template,
                storage_reader=storage_reader(path),
                planner=safe_planner(_EmptyStateDictLoadPlanner, path),
                no_dist=True,
            )
        else:
            dcp.load(template, storage_reader=storage_reader(path), planner=safe_planner(DefaultLoadPlanner, path))
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP raises CheckpointException (a BaseException, on every rank) for unreadable shards
        refused = refusal_in(e)
        if refused is not None:  # a crafted file, refused before any of it ran: never "corrupt", never skipped
            raise UnsafeCheckpointError(str(refused)) from None
        raise CheckpointError(_unreadable(path, e)) from e


def _unreadable(path: Location, e: BaseException) -> str:
    """Why ``path`` could not be read, naming the ranks whose reads failed (each rank reads its own copy where work
    dirs are node-local)."""
    failed = sorted(e.failures) if isinstance(e, CheckpointException) else []
    rank = get_rank()
    if failed and rank not in failed:
        first = e.failures[failed[0]][0]  # type: ignore[attr-defined]
        return (
            f"Cannot read checkpoint {str(path)!r} on every rank: this rank's ({rank}) copy reads, the read failed on "
            f"rank(s) {failed} "
            f"({type(first).__name__}: {str(first)[:300]}). Their copy of it is broken (a node-local work dir copied "
            "incompletely?): "
            "repair or delete the directory on their node; the ranks resume from the previous checkpoint together."
        )
    if (
        failed
    ):  # this rank's own copy is broken (and maybe others'): the message names the rank, so every rank prints it
        cause = e.failures[rank][0]  # type: ignore[attr-defined]
        return (
            f"Cannot read checkpoint {str(path)!r} on rank {rank} (the read failed on rank(s) {failed}): "
            f"{type(cause).__name__}: {str(cause)[:300]}. "
            "Resume from the previous checkpoint (delete or move this directory, or point `resume=` at an older one)."
        )
    where = f" on rank {rank}" if get_world_size() > 1 else ""  # a message naming its rank is printed by that rank too
    return (
        f"Cannot read checkpoint {str(path)!r}{where}: {type(e).__name__}: {str(e)[:500]}. "
        "Resume from the previous checkpoint (delete or move this directory, or point `resume=` at an older one)."
    )


def load_full(path: str | os.PathLike[str] | RemotePath) -> dict[str, Any]:
    """Read a sharded checkpoint directory into one process as full (unsharded) tensors; no process group needed.

    DCP stores global shapes, so a checkpoint of N processes loads into M, or here into one.

    Returns the trainer's checkpoint dict: ``trainer_state.pth`` with the full model weights
    under ``"model"`` and each optimizer's state (keyed by parameter name, which
    ``torch.optim.Optimizer.load_state_dict`` maps by position) put back in its place.
    """
    p = location(path)
    state = read_trainer_state(p)
    sharded: dict[str, Any] = {}
    load_into(p, sharded, everything=True)
    return merge(state, sharded)


def load_outline(path: str | os.PathLike[str] | RemotePath) -> dict[str, Any]:
    """:func:`load_full` without the tensors' data: each tensor is a ``meta`` tensor of its full shape and dtype.

    Only ``.metadata``, ``trainer_state.pth`` and the (small) non-tensor entries are read, so a large checkpoint is
    described in a moment (``trainwright ckpt inspect``).
    """
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    p = location(path)
    state = read_trainer_state(p)
    check_metadata(p)
    entries = storage_reader(p).read_metadata()
    paths = entries.planner_data or {}
    values = {k for k, v in entries.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
    sharded: dict[str, Any] = {}
    if values:
        try:
            _load_state_dict(
                sharded,
                storage_reader=storage_reader(p),
                planner=safe_planner(_EmptyStateDictLoadPlanner, p, keys=values),
                no_dist=True,
            )
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - as in load_into
            refused = refusal_in(e)
            if refused is not None:
                raise UnsafeCheckpointError(str(refused)) from None
            raise CheckpointError(_unreadable(p, e)) from e
    for key, entry in entries.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            shape = torch.empty(tuple(entry.size), dtype=entry.properties.dtype, device="meta")
            _put(sharded, tuple(paths.get(key, (key,))), shape)
    return merge(state, sharded)


def _put(root: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Set ``value`` at ``path`` (mapping keys and list indices) under ``root``, creating dicts and lists on the way."""
    node: Any = root
    for depth, key in enumerate(path):
        last = depth == len(path) - 1
        fresh: Any = None if last else ([] if isinstance(path[depth + 1], int) else {})
        if isinstance(node, list):
            node.extend([None] * (key + 1 - len(node)))
            if last or node[key] is None:
                node[key] = value if last else fresh
        elif last or key not in node:
            node[key] = value if last else fresh
        node = node[key]


EXTRA = "extra"
"""The part of the DCP files holding sharded tensors from outside the model and optimizers.

(An EMA or SWA average of FSDP shards.)
"""
_EXTRA_PATHS = "_dcp_extra"  # the key of trainer_state.pth listing where those tensors belong


def split(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(sharded, rest)``: the model and optimizer states for DCP, everything else for ``trainer_state.pth``.

    A DTensor anywhere else in the state (a hook's average of the model's shards) goes to DCP
    too, under :data:`EXTRA`, keyed by its path: nothing sharded is pickled into ``trainer_state.pth``
    (rank 0 alone writes it), and nothing is gathered to save it.
    """
    rest = dict(state)
    sharded: dict[str, Any] = {"model": rest.pop("model")}
    ow = rest.get("optim_wrapper")
    if isinstance(ow, Mapping):
        ow = dict(ow)
        if "optimizer" in ow:
            sharded["optim"] = {"": ow.pop("optimizer")}
        else:  # an OptimWrapperDict: {name: wrapper state}
            sharded["optim"] = {}
            for name, sub in list(ow.items()):
                if isinstance(sub, Mapping) and "optimizer" in sub:
                    sub = dict(sub)
                    sharded["optim"][name] = sub.pop("optimizer")
                    ow[name] = sub
        rest["optim_wrapper"] = ow
    extras: dict[str, Any] = {}
    rest = _pull_sharded(rest, (), extras)
    if extras:
        sharded[EXTRA] = extras
        rest[_EXTRA_PATHS] = sorted(extras)
    return sharded, rest


def _pull_sharded(obj: Any, path: tuple[str, ...], out: dict[str, Any]) -> Any:
    """``obj`` with each DTensor leaf moved into ``out`` (key: the JSON of its path of mapping keys) and None left in
    its place.

    Only the mappings on a path to a DTensor are copied (as dicts); everything else is ``obj``'s own.
    """
    if is_sharded(obj):
        out[json.dumps(path)] = obj
        return None
    if not isinstance(obj, Mapping):
        return obj
    before = len(out)
    pulled = {k: _pull_sharded(v, (*path, k), out) if isinstance(k, str) else v for k, v in obj.items()}
    return pulled if len(out) > before else obj


def has_extras(rest: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's ``trainer_state.pth`` (``rest``) names :data:`EXTRA` tensors in the DCP files."""
    return bool(rest.get(_EXTRA_PATHS))


def extra_templates(path: Location, like: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Empty tensors for ``dcp.load`` to fill with the checkpoint's :data:`EXTRA` entries, each process its part.

    An entry whose path ends in a name of ``like`` (this run's model state dict) with the same
    shape is read sharded as that tensor is: an EMA or SWA average of parameter ``fc.weight``
    comes back as this process's shard of it, at any world size or layout. Any other entry is
    read whole, on every process.

    Raises:
        CheckpointError: the metadata is missing or unreadable.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = storage_reader(path).read_metadata()
    prefix = EXTRA + "."
    out: dict[str, torch.Tensor] = {}
    for k, v in meta.state_dict_metadata.items():
        if not k.startswith(prefix) or not isinstance(v, TensorStorageMetadata):
            continue
        key = k[len(prefix) :]
        model_t = like.get(json.loads(key)[-1])
        if isinstance(model_t, torch.Tensor) and is_sharded(model_t) and tuple(model_t.shape) == tuple(v.size):
            out[key] = torch.empty_like(model_t, dtype=v.properties.dtype)
        else:
            out[key] = torch.empty(tuple(v.size), dtype=v.properties.dtype)
    return out


def merge(rest: dict[str, Any], sharded: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`split` (each :data:`EXTRA` tensor back at its path)."""
    out = dict(rest)
    extras = dict(sharded.get(EXTRA, {}))
    for key in out.pop(_EXTRA_PATHS, []):
        *parents, leaf = json.loads(key)
        node = out
        for name in parents:
            node[name] = dict(node[name])  # copies along the path: the caller's dicts stay as they were
            node = node[name]
        node[leaf] = extras[key]
    out["model"] = sharded["model"]
    for name, opt in dict(sharded.get("optim", {})).items():
        if name:
            out["optim_wrapper"] = {**out["optim_wrapper"], name: {**out["optim_wrapper"][name], "optimizer": opt}}
        else:
            out["optim_wrapper"] = {**out["optim_wrapper"], "optimizer": opt}
    return out


def as_cpu(obj: Any) -> Any:
    """``obj`` with tensors moved to CPU (what rank 0 writes into ``trainer_state.pth``)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, Mapping):
        return {k: as_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(as_cpu(v) for v in obj)
    return obj
