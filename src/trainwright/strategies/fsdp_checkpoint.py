"""The checkpoint directories of :class:`~trainwright.strategies.fsdp.FSDPStrategy`: what its checkpoint methods
delegate to.

:class:`ShardedWrites` (the strategy's one piece of write state) writes a DCP directory (every rank
its shards, rank 0 ``trainer_state.pth``; complete or absent), locally or on an fsspec URL, now or
in the background, and finishes a background write; :func:`load` reads a directory at any world
size. The file format is :mod:`trainwright.strategies.dcp_io`'s; this module adds the collectives.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainwright.checkpoint.remote_io import after_published, keep_locally, kept_path
from trainwright.checkpoint.storage import fsspec_store, local_path
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


class ShardedWrites:
    """A sharded strategy's checkpoint writes: the side process group of background writes and the one write in flight.

    :meth:`save` writes a DCP directory, locally or on a URL, now or in the background;
    :meth:`wait` finishes a background write (called on every rank, from the training thread);
    :meth:`close` finishes it and destroys the side group at teardown.
    """

    def __init__(self) -> None:
        self.group: Any = None  # the gloo group of DCP's background writes (never the training group)
        self.pending: _Pending | None = None

    def side_group(self) -> Any:
        """The process group of background writes, made on first use (every rank calls this together)."""
        if self.group is None:
            self.group = dist.new_group(backend="gloo")
        return self.group

    def save(
        self,
        strategy: FSDPStrategy,
        path: str | Path | RemotePath,
        state: Mapping[str, Any],
        *,
        async_save: bool,
        after: Callable[[], None] | None,
    ) -> None:
        """:meth:`FSDPStrategy.save_checkpoint <trainwright.strategies.fsdp.FSDPStrategy.save_checkpoint>`: a local
        directory, or a URL."""
        import torch.distributed.checkpoint as dcp

        from trainwright.checkpoint.storage import RemotePath, location
        from trainwright.strategies import dcp_io

        self.wait(strategy)
        remote = location(path)  # a RemotePath carries its store; a URL string gets a new one
        if isinstance(remote, RemotePath):
            if async_save:
                self._save_remote_async(strategy, remote, state, after)
            else:
                save_remote(strategy, remote, state, after=after)
            return
        target = local_path(path)
        tmp, sharded = _stage_locally(strategy, target, state)

        def finish() -> None:
            if strategy.is_main_process:
                dcp_io.publish(tmp, target)
                if after is not None:
                    after()

        if async_save:
            future = dcp.async_save(
                sharded, storage_writer=dcp.FileSystemWriter(str(tmp)), process_group=self.side_group()
            )
            self.pending = _Pending(future, finish)
            return
        dcp_io.save_shards(sharded, tmp, target)  # a failed shard write: OSError naming the path, nothing replaced
        finish()
        strategy.barrier()

    def _save_remote_async(
        self, strategy: FSDPStrategy, target: RemotePath, state: Mapping[str, Any], after: Callable[[], None] | None
    ) -> None:
        """Write the directory locally in the background (DCP), then upload it from a thread; :meth:`wait` publishes it.

        The local copy (a hidden folder in the store's fallback folder) is what a failed
        upload leaves: renamed to ``fallback/<name>``, a complete local checkpoint.
        """
        import torch.distributed.checkpoint as dcp

        if strategy.is_main_process:
            try:
                if target.exists():  # an incomplete folder of that name (an earlier write that was killed)
                    target.remove()
            except Exception:  # noqa: BLE001 - a store that is down: the upload below fails and the local copy is kept
                pass
        tmp, sharded = _stage_locally(strategy, kept_path(target), state)
        future = dcp.async_save(sharded, storage_writer=dcp.FileSystemWriter(str(tmp)), process_group=self.side_group())
        upload = _Upload(future, tmp, target, strategy.rank)
        self.pending = _Pending(future, lambda: _finish_upload(strategy, upload, after), upload)

    def wait(self, strategy: FSDPStrategy) -> None:
        """Finish the background write, if any: publish it (rank 0) and run its ``after``; re-raise a local write's
        error."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        if pending.upload is None:
            _result(pending.future)
        pending.finish()

    def close(self, strategy: FSDPStrategy) -> None:
        """Finish the last write, then destroy the side group once every rank is done with it (no collective after a
        failed run)."""
        self.wait(strategy)
        if self.group is not None:
            if dist.is_initialized() and not strategy.run_failed:
                dist.barrier()  # every rank's background write is done with the side group
                dist.destroy_process_group(self.group)
            self.group = None


@dataclass
class _Pending:
    """A background write: DCP's future, what publishes it, and the upload that follows it (remote targets)."""

    future: Any
    finish: Callable[[], None]
    upload: _Upload | None = None


def _result(future: Any) -> Any:
    """Wait for DCP's background write (``upload_completion`` of newer torch's response, else the future itself)."""
    return (future.upload_completion if hasattr(future, "upload_completion") else future).result()


class _Upload:
    """This rank's upload of its files of a checkpoint directory written locally, on a thread started at once.

    The thread waits for DCP's local write, then puts this rank's shard files (rank 0: also
    ``trainer_state.pth``) under the URL, each retried by the store. ``.metadata`` is not
    uploaded here: rank 0 puts it last, once every rank's files are there (:func:`_finish_upload`).
    """

    def __init__(self, future: Any, local: Path, target: RemotePath, rank: int) -> None:
        self.future, self.local, self.target, self.rank = future, local, target, rank
        self.write_error: BaseException | None = None  # the local write failed: there is no complete copy anywhere
        self.upload_error: BaseException | None = None  # the local copy is complete; its upload failed
        self.thread = threading.Thread(target=self._run, name=f"trainwright-upload-{target.name}", daemon=True)
        self.thread.start()

    def own_files(self) -> list[Path]:
        """This rank's files of the local directory: DCP's ``__<rank>_*.distcp`` (rank 0: and ``trainer_state.pth``)."""
        from trainwright.strategies import dcp_io

        files = sorted(self.local.glob(f"__{self.rank}_*"))
        return files + ([self.local / dcp_io.TRAINER_STATE] if self.rank == 0 else [])

    def _run(self) -> None:
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            _result(self.future)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            self.write_error = e
            return
        try:
            for f in self.own_files():
                (self.target / f.name).upload(f)
        except Exception as e:  # noqa: BLE001 - any storage error: the local copy is kept
            self.upload_error = e

    def join(self) -> None:
        """Wait for the thread (the local write and this rank's uploads)."""
        self.thread.join()


def _finish_upload(strategy: FSDPStrategy, upload: _Upload, after: Callable[[], None] | None) -> None:
    """Complete a background remote write on every rank: all uploads done, rank 0 puts ``.metadata`` and runs ``after``.

    Two agreements (one boolean each) on the training group: every rank's files are up; then
    rank 0's ``.metadata`` (or, when the first failed, whether every local write succeeded). Any failure keeps the local
    copy as
    ``fallback/<name>`` (a complete checkpoint, unless the local write itself failed) with a
    warning naming it, deletes the partial remote folder (best effort: without ``.metadata``
    resume skips it anyway) and leaves ``latest`` as it was. After a failed run there is no
    collective: the local copy is kept without trying ``.metadata``.
    """
    import shutil
    import warnings

    from trainwright.strategies import dcp_io

    upload.join()
    target = upload.target
    error: BaseException | None = upload.write_error or upload.upload_error
    if strategy.run_failed:  # no collective: the other ranks may be gone
        failed, written = True, upload.write_error is None
    elif strategy.any_true(error is not None):
        failed, written = True, not strategy.any_true(upload.write_error is not None)
    else:  # every rank wrote and uploaded its files
        if strategy.is_main_process:
            try:
                (target / dcp_io.METADATA).upload(
                    upload.local / dcp_io.METADATA
                )  # last: the directory is complete from here on
            except Exception as e:  # noqa: BLE001 - any storage error: the local copy is kept
                error = e
        failed, written = strategy.any_true(error is not None), True
    if not failed:
        shutil.rmtree(upload.local, ignore_errors=True)
        _after_written(strategy, target, after)
        return
    if strategy.is_main_process:
        try:
            target.remove()
        except Exception:  # noqa: BLE001 - the store is down: resume skips a folder without .metadata
            pass
    if not written:
        if strategy.is_main_process:
            shutil.rmtree(upload.local, ignore_errors=True)
            warnings.warn(
                f"Writing checkpoint {target.url} in the background failed: its local copy could not be written either "
                f"({error!r}); "
                f"this checkpoint is lost. Training goes on; `latest` in {target.parent.url} still names the previous "
                "one.",
                stacklevel=4,
            )
        return
    if strategy.is_main_process:  # the local copy is complete: kept in the store's fallback folder
        keep_locally(
            upload.local,
            target,
            error if error is not None else "another rank could not upload its files",
            stacklevel=5,
        )


def _after_written(strategy: FSDPStrategy, target: RemotePath, after: Callable[[], None] | None) -> None:
    """Rank 0, once the checkpoint at ``target`` is complete: run ``after`` (``latest``, old checkpoints); its
    failure only warns."""
    if strategy.is_main_process:
        after_published(target, after, stacklevel=6)


def _stage_locally(strategy: FSDPStrategy, target: Path, state: Mapping[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The hidden temporary directory of ``target`` (rank 0 draws its name, and writes ``trainer_state.pth`` into it)
    and the shards to write there."""
    from trainwright.checkpoint.io import atomic_save
    from trainwright.strategies import dcp_io

    tmp = Path(strategy.broadcast_object(str(dcp_io.temp_dir(target, dcp_io.new_token()))))
    sharded, rest = dcp_io.split(state)
    if strategy.is_main_process:
        tmp.mkdir(parents=True)
        atomic_save(dcp_io.as_cpu(rest), tmp / dcp_io.TRAINER_STATE)
    strategy.barrier()
    return tmp, sharded


def save_remote(
    strategy: FSDPStrategy, target: RemotePath, state: Mapping[str, Any], *, after: Callable[[], None] | None
) -> None:
    """Write a checkpoint directory on an fsspec URL in place, now: rank 0 ``trainer_state.pth``, then the shards,
    ``.metadata`` last.

    DCP (``FsspecWriter``) writes ``.metadata`` once every shard is written: a directory
    without it is incomplete and resume skips it. A failed write is tried again (the
    store's tries, every rank together: DCP reports a failure on every rank); if it still
    fails, the checkpoint is written into ``work_dir/checkpoints_unuploaded`` instead, with a
    warning, ``after`` does not run (``latest`` and the older checkpoints stay) and training
    goes on. (A background write goes through a local copy instead: see ``ShardedWrites._save_remote_async``.)
    """
    import warnings

    from trainwright.strategies import dcp_io

    store = fsspec_store(target)
    sharded, rest = dcp_io.split(state)
    error: Exception | None = None
    for attempt in range(store.tries):
        error = None
        if strategy.is_main_process:
            try:
                if target.exists():  # an incomplete folder of that name (an earlier write that was killed)
                    target.remove()
                buf = io.BytesIO()
                torch.save(dcp_io.as_cpu(rest), buf)
                store.fs.pipe_file(
                    (target / dcp_io.TRAINER_STATE).url, buf.getvalue()
                )  # one PUT; before the shards and .metadata
            except Exception as e:  # noqa: BLE001 - handled together on every rank below
                error = e
        if strategy.any_true(error is not None):
            error = error or OSError(f"rank 0 could not write {target.url}/{dcp_io.TRAINER_STATE}")
            if attempt + 1 < store.tries:
                time.sleep(store.backoff_s * 2**attempt)
            continue
        try:
            dcp_io.save_shards(sharded, target, target)
            _after_written(strategy, target, after)
            strategy.barrier()
            return
        except OSError as e:
            error = e
            if attempt + 1 < store.tries:
                warnings.warn(
                    f"Writing checkpoint {target.url} failed ({e}); trying again ({attempt + 2} of {store.tries})",
                    stacklevel=4,
                )
                time.sleep(store.backoff_s * 2**attempt)
    # the store keeps failing: the checkpoint goes to the local fallback folder, written as a local sharded checkpoint
    local = kept_path(target)
    strategy.save_checkpoint(local, state)
    if strategy.is_main_process:
        keep_locally(local, target, error if error is not None else "unknown error", stacklevel=5)


def load(strategy: FSDPStrategy, p: Location) -> dict[str, Any]:
    """Read the checkpoint directory ``p`` into ``strategy``'s sharding (see :meth:`FSDPStrategy.load_checkpoint
    <trainwright.strategies.fsdp.FSDPStrategy.load_checkpoint>`)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from trainwright.checkpoint.io import CheckpointError
    from trainwright.strategies import dcp_io

    if not p.is_dir():
        raise FileNotFoundError(
            f"Checkpoint {str(p)!r} does not exist. Check the path, or pass resume=True to pick the newest checkpoint "
            "in a directory."
        )
    error: Exception | None = None
    try:
        rest = dcp_io.read_trainer_state(p)
        check_model_shapes(strategy, p, dcp_io.saved_shapes(p, "model."))
    except CheckpointError as e:
        error = e
    if strategy.any_true(error is not None):  # every rank gives up on this directory together
        raise (
            error
            if error is not None
            else CheckpointError(f"Cannot read checkpoint {str(p)!r}: another rank could not read it (see its log)")
        )
    module = strategy.state_module(strategy.unwrap_model())
    # templates with this run's sharding; copies, so that a read that fails halfway leaves the model and optimizer as
    # they were
    sharded: dict[str, Any] = {"model": strategy.model_state_dict()}
    optim = rest.get("optim_wrapper")
    if isinstance(optim, Mapping):
        wrappers = optim_wrappers_of(strategy.checkpointed_optim_wrapper)
        sharded["optim"] = {
            name: get_optimizer_state_dict(module, ow.optimizer)
            for name, ow in wrappers.items()
            if (name in optim if name else True)
        }
    sharded = copy_tensors(sharded)
    if dcp_io.has_extras(
        rest
    ):  # sharded tensors of other pieces (a hook's average): read as the model's tensor of the same name is
        sharded[dcp_io.EXTRA] = dcp_io.extra_templates(p, like=sharded["model"])
    dcp_io.load_into(p, sharded)
    return dcp_io.merge(rest, sharded)


def check_model_shapes(strategy: FSDPStrategy, path: Location, saved: Mapping[str, tuple[int, ...]]) -> None:
    """Raise a RuntimeError naming every key and shape of ``saved`` that differs from ``strategy``'s model (nothing
    is loaded then)."""
    own = {k: tuple(v.shape) for k, v in strategy.model_state_dict().items() if isinstance(v, torch.Tensor)}
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = [f"{k}: checkpoint {saved[k]}, model {own[k]}" for k in own if k in saved and saved[k] != own[k]]
    if missing or unexpected or shapes:
        lines = (
            ([f"missing keys: {missing}"] if missing else [])
            + ([f"unexpected keys: {unexpected}"] if unexpected else [])
            + shapes
        )
        raise RuntimeError(
            f"The checkpoint {str(path)!r} does not match the trainer's model, nothing was loaded:\n  "
            + "\n  ".join(lines)
            + "\nResume with the same model definition, or use load_from= (weights only, strict=False) to start a "
            "new run from these weights."
        )
