"""The checkpoint directories of :class:`~trainwright.strategies.fsdp.FSDPStrategy`: what its checkpoint methods delegate to.

:func:`save` writes a DCP directory (every rank its shards, rank 0 ``trainer_state.pth``; complete
or absent), :func:`save_remote` one on an fsspec URL in place (retried, else kept locally),
:func:`wait` finishes a background write, :func:`load` reads a directory at any world size.
The file format is :mod:`trainwright.strategies.dcp_io`'s; these functions add the collectives.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainwright.optim.optim_wrapper_dict import optim_wrappers_of

if TYPE_CHECKING:
    from trainwright.checkpoint.storage import Location, RemotePath
    from trainwright.strategies.fsdp import FSDPStrategy


def copy_tensors(obj: Any) -> Any:
    """``obj`` with every tensor cloned (a DTensor keeps its sharding)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, Mapping):
        return {k: copy_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [copy_tensors(v) for v in obj]
    return obj


def save(strategy: FSDPStrategy, path: str | Path, state: Mapping[str, Any], *, async_save: bool, after: Callable[[], None] | None) -> None:
    """:meth:`FSDPStrategy.save_checkpoint <trainwright.strategies.fsdp.FSDPStrategy.save_checkpoint>`: a local directory, or a URL (:func:`save_remote`)."""
    import torch.distributed.checkpoint as dcp

    from trainwright.checkpoint.io import atomic_save
    from trainwright.checkpoint.storage import RemotePath, location
    from trainwright.strategies import dcp_io

    strategy.wait_for_checkpoint()
    remote = location(path) if isinstance(path, str) else None  # a URL string: its store (see storage.location)
    if isinstance(remote, RemotePath):
        save_remote(strategy, remote, state, async_save=async_save, after=after)
        return
    target = Path(path)
    tmp = Path(strategy.broadcast_object(str(dcp_io.temp_dir(target, dcp_io.new_token()))))
    sharded, rest = dcp_io.split(state)
    if strategy.is_main_process:
        tmp.mkdir(parents=True)
        atomic_save(dcp_io.as_cpu(rest), tmp / dcp_io.TRAINER_STATE)
    strategy.barrier()
    writer = dcp.FileSystemWriter(str(tmp))

    def finish() -> None:
        if strategy.is_main_process:
            dcp_io.publish(tmp, target)
            if after is not None:
                after()

    if async_save:
        if strategy._async_group is None:  # the background write's collectives must not share the training group
            strategy._async_group = dist.new_group(backend="gloo")
        future = dcp.async_save(sharded, storage_writer=writer, process_group=strategy._async_group)
        strategy._pending = (future, finish, None)
        return
    dcp_io.save_shards(sharded, tmp, target)  # a failed shard write: OSError naming the path, nothing replaced
    finish()
    strategy.barrier()


def save_remote(strategy: FSDPStrategy, target: RemotePath, state: Mapping[str, Any], *, async_save: bool, after: Callable[[], None] | None) -> None:
    """Write a checkpoint directory on an fsspec URL in place: rank 0 ``trainer_state.pth``, then the shards, ``.metadata`` last.

    DCP (``FsspecWriter``) writes ``.metadata`` once every shard is written: a directory
    without it is incomplete and resume skips it. A failed write is tried again (the
    store's tries, every rank together: DCP reports a failure on every rank); if it still
    fails, the checkpoint is written into ``work_dir/checkpoints_unuploaded`` instead, with a
    warning, ``after`` does not run (``latest`` and the older checkpoints stay) and training
    goes on. A background (``async_save``) write that fails is a warning: its staged copy is
    gone, the checkpoint is lost, ``latest`` names the previous one.
    """
    import warnings

    import torch.distributed.checkpoint as dcp

    from trainwright.strategies import dcp_io

    store = target.store
    sharded, rest = dcp_io.split(state)

    def finish() -> None:
        if strategy.is_main_process and after is not None:
            try:
                after()
            except Exception as e:  # noqa: BLE001 - the checkpoint is complete; only the pointer is stale
                warnings.warn(f"Checkpoint {target.url} was written, but updating `latest` / deleting old checkpoints failed ({store.explain(e)})", stacklevel=4)

    error: Exception | None = None
    for attempt in range(store.tries):
        error = None
        if strategy.is_main_process:
            try:
                if target.exists():  # an incomplete folder of that name (an earlier write that was killed)
                    target.remove()
                buf = io.BytesIO()
                torch.save(dcp_io.as_cpu(rest), buf)
                store.fs.pipe_file((target / dcp_io.TRAINER_STATE).url, buf.getvalue())  # one PUT; before the shards and .metadata
            except Exception as e:  # noqa: BLE001 - handled together on every rank below
                error = e
        if strategy.any_true(error is not None):
            error = error or OSError(f"rank 0 could not write {target.url}/{dcp_io.TRAINER_STATE}")
            if attempt + 1 < store.tries:
                time.sleep(store.backoff_s * 2**attempt)
            continue
        if async_save:
            if strategy._async_group is None:
                strategy._async_group = dist.new_group(backend="gloo")
            future = dcp.async_save(sharded, storage_writer=dcp_io.storage_writer(target), process_group=strategy._async_group)
            strategy._pending = (future, finish, target)
            return
        try:
            dcp_io.save_shards(sharded, target, target)
            finish()
            strategy.barrier()
            return
        except OSError as e:
            error = e
            if attempt + 1 < store.tries:
                warnings.warn(f"Writing checkpoint {target.url} failed ({e}); trying again ({attempt + 2} of {store.tries})", stacklevel=4)
                time.sleep(store.backoff_s * 2**attempt)
    # the store keeps failing: the checkpoint goes to the local fallback folder, written as a local sharded checkpoint
    local = (store.fallback_dir or Path.cwd() / "checkpoints_unuploaded") / target.name
    strategy.save_checkpoint(local, state)
    if strategy.is_main_process:
        warnings.warn(
            f"Could not write checkpoint {target.url} ({store.explain(error) if error is not None else 'unknown error'}); kept it locally as {local}. "
            f"Training goes on; `latest` in {target.parent.url} still names the previous checkpoint. Copy the folder there once the storage "
            f"is back, or resume from it with resume={str(local)!r}.",
            stacklevel=4,
        )


def wait(strategy: FSDPStrategy) -> None:
    """:meth:`FSDPStrategy.wait_for_checkpoint <trainwright.strategies.fsdp.FSDPStrategy.wait_for_checkpoint>`: finish the background write, if any."""
    pending, strategy._pending = strategy._pending, None
    if pending is None:
        return
    future, finish, remote = pending
    if remote is None:
        (future.upload_completion if hasattr(future, "upload_completion") else future).result()
        finish()
        return
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        (future.upload_completion if hasattr(future, "upload_completion") else future).result()
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        import warnings

        warnings.warn(f"Writing checkpoint {remote.url} in the background failed ({remote.store.explain(e)}); it is lost (its staged copy is gone). "
                      f"Training goes on; `latest` in {remote.parent.url} still names the previous checkpoint. async_save=False keeps a "
                      "checkpoint whose upload fails in work_dir/checkpoints_unuploaded.", stacklevel=3)
        return
    finish()


def load(strategy: FSDPStrategy, p: Location) -> dict[str, Any]:
    """Read the checkpoint directory ``p`` into ``strategy``'s sharding (see :meth:`FSDPStrategy.load_checkpoint <trainwright.strategies.fsdp.FSDPStrategy.load_checkpoint>`)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from trainwright.checkpoint.io import CheckpointError
    from trainwright.strategies import dcp_io

    if not p.is_dir():
        raise FileNotFoundError(f"Checkpoint {str(p)!r} does not exist. Check the path, or pass resume=True to pick the newest checkpoint in a directory.")
    error: Exception | None = None
    try:
        rest = dcp_io.read_trainer_state(p)
        check_model_shapes(strategy, p, dcp_io.saved_shapes(p, "model."))
    except CheckpointError as e:
        error = e
    if strategy.any_true(error is not None):  # every rank gives up on this directory together
        raise error if error is not None else CheckpointError(f"Cannot read checkpoint {str(p)!r}: another rank could not read it (see its log)")
    module = strategy._state_module(strategy.unwrap_model())
    # templates with this run's sharding; copies, so that a read that fails halfway leaves the model and optimizer as they were
    sharded: dict[str, Any] = {"model": strategy.model_state_dict()}
    optim = rest.get("optim_wrapper")
    if isinstance(optim, Mapping):
        wrappers = optim_wrappers_of(strategy._optim_wrapper)
        sharded["optim"] = {name: get_optimizer_state_dict(module, ow.optimizer) for name, ow in wrappers.items() if (name in optim if name else True)}
    sharded = copy_tensors(sharded)
    dcp_io.load_into(p, sharded)
    return dcp_io.merge(rest, sharded)


def check_model_shapes(strategy: FSDPStrategy, path: Location, saved: Mapping[str, tuple[int, ...]]) -> None:
    """Raise a RuntimeError naming every key and shape of ``saved`` that differs from ``strategy``'s model (nothing is loaded then)."""
    own = {k: tuple(v.shape) for k, v in strategy.model_state_dict().items() if isinstance(v, torch.Tensor)}
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = [f"{k}: checkpoint {saved[k]}, model {own[k]}" for k in own if k in saved and saved[k] != own[k]]
    if missing or unexpected or shapes:
        lines = ([f"missing keys: {missing}"] if missing else []) + ([f"unexpected keys: {unexpected}"] if unexpected else []) + shapes
        raise RuntimeError(f"The checkpoint {str(path)!r} does not match the trainer's model, nothing was loaded:\n  " + "\n  ".join(lines)
                           + "\nResume with the same model definition, or use load_from= (weights only, strict=False) to start a new run from these weights.")
