"""Strategy: where the model lives, how it steps and how its state is saved — the only device-aware layer.

A strategy is an :class:`~trainwright.optim.engine.UpdateEngine`: optim wrappers call its
``backward`` / ``clip_grad`` / ``optimizer_step``. Order of a run: ``setup_env`` →
``prepare(model)`` → ``setup_optim_wrapper(ow)`` → steps (docs/architecture.md). Every checkpoint
read and write goes through the strategy, so a sharded strategy owns its format.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainwright.amp.precision import Precision
from trainwright.model.data_preprocessor import set_preprocessor_device
from trainwright.optim.engine import ClipFn, UpdateEngine
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.registry import check_keys
from trainwright.strategies.parts import StrategyParts

if TYPE_CHECKING:
    from trainwright.checkpoint.async_writer import AsyncCheckpointWriter
    from trainwright.checkpoint.storage import Location, RemotePath
    from trainwright.dist.side_channel import SideChannel


class Strategy(UpdateEngine, StrategyParts):
    """Base strategy: one process; subclasses add devices and process groups.

    Optim wrappers ask its ``no_sync_context`` once.
    :class:`~trainwright.strategies.process_group.ProcessGroupStrategy` adds the process group
    and collectives; DDP, FSDP2 and DeepSpeed are its subclasses. :meth:`prepare` moves,
    converts, parallelizes, checkpoints, compiles and wraps the model, in that order; the
    optimizer is built over the prepared model before :meth:`setup_optim_wrapper`.

    mmengine's ``BaseStrategy`` methods (``build_model``, ``build_optim_wrapper``,
    ``build_param_scheduler``, ``resume``, ``load_or_resume``) come from
    :class:`~trainwright.strategies.parts.StrategyParts`.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device``; default: the
            local CUDA device when available, else CPU.
    """

    name = "base"
    #: What a checkpoint is called after its stem (``iter_8`` + ``.pth``); a sharded strategy writes directories
    #: (``.dcp``).
    checkpoint_suffix = ".pth"
    #: What ``resume=True`` looks for: full files, and a sharded run's directories (read whole, see
    #: :meth:`load_checkpoint`).
    resumable_suffixes: tuple[str, ...] = (".pth", ".dcp")
    #: Whether what :meth:`prepare` builds fixes the train batch size (DeepSpeed's engine): the train parts are then
    #: not rebuilt for another loader (``find_batch_size(apply=True)`` refuses).
    fixes_batch_size: bool = False
    #: Whether :meth:`save_checkpoint` / :meth:`load_checkpoint` take an fsspec URL (``s3://...``, see
    #: ``checkpoint/storage.py``).
    remote_checkpoints = True
    #: Whether :meth:`read_checkpoint` reads this strategy's checkpoints whole in one process (what publishing one
    #: needs).
    readable_whole = True
    #: Whether a forward of the model runs on this process alone, without a collective (one device, or a replicated
    #: model such as DDP's): a diagnosis may then replay a batch on one rank (see ``diagnose/nonfinite.py``).
    forward_is_local = True
    #: Set by the Trainer when a run of this process ended by an exception (reset when the next run starts): the other
    #: processes may be anywhere (in a collective of their own), so teardown and checkpoint saves make no collective
    #: then.
    run_failed = False
    #: The collective a rank of this strategy waits in inside ``backward`` while another rank is behind (DDP's gradient
    #: all-reduce), named in a stall report; None: its backward waits for no other rank.
    backward_collective: str | None = None

    def __init__(self, device: str | torch.device | None = None) -> None:
        from trainwright.dist.utils import get_local_rank

        if device is None:
            device = f"cuda:{get_local_rank()}" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if (
            self.device.type == "cuda" and self.device.index is None
        ):  # "cuda": this process's GPU (torch.cuda.set_device needs the index)
            self.device = torch.device("cuda", get_local_rank())
        self.model: nn.Module | None = None
        self.seed: int | None = None
        #: The run's precision: what the model is prepared with (FSDP's policy) and evaluation autocasts with (set by
        #: the Trainer).
        self.precision: Precision = Precision()
        self._ckpt_writer: AsyncCheckpointWriter | None = None  # created by the first async save
        self._param_positions: tuple[nn.Module, dict[int, int]] | None = (
            None  # the model's parameter order, by id (in_model_order)
        )

    # -- environment ----------------------------------------------------------------------
    def setup_env(
        self,
        *,
        cudnn_benchmark: bool = False,
        dist_cfg: Mapping[str, Any] | None = None,
        randomness: Mapping[str, Any] | None = None,
    ) -> None:
        """Set cudnn flags and seed every RNG (``randomness=dict(seed, deterministic, diff_rank_seed)``)."""
        torch.backends.cudnn.benchmark = (
            cudnn_benchmark  # as mmengine: set whatever the device (cudnn reads it on CUDA)
        )
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        randomness = dict(randomness or {})
        check_keys("randomness", randomness, {"seed", "deterministic", "diff_rank_seed"})
        from trainwright.utils.seed import set_random_seed

        self.seed = set_random_seed(
            randomness.get("seed"),
            deterministic=bool(randomness.get("deterministic", False)),
            rank_offset=self.rank if randomness.get("diff_rank_seed") else 0,
        )

    # -- process facts --------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's global rank."""
        return 0

    @property
    def world_size(self) -> int:
        """Number of processes."""
        return 1

    @property
    def is_main_process(self) -> bool:
        """True on rank 0."""
        return self.rank == 0

    # -- data parallelism: how many different batches a step sees ---------------------------
    @property
    def data_parallel_size(self) -> int:
        """Number of data shards: processes that see different batches (the world size; less with tensor parallelism).

        The train and evaluation loaders are sharded this many ways and the logged throughput
        counts this many batches per step. Processes of one model replica (a tensor-parallel
        group) share a shard: they must receive the same batch.
        """
        return self.world_size

    @property
    def data_parallel_rank(self) -> int:
        """This process's data shard, in ``range(data_parallel_size)`` (its rank; with tensor parallelism its
        replica's index)."""
        return self.rank

    # -- model ----------------------------------------------------------------------------
    def prepare(
        self,
        model: nn.Module,
        *,
        compile: bool | Mapping[str, Any] = False,
        activation_checkpointing: Sequence[type[nn.Module] | str] = (),
    ) -> nn.Module:
        """Make ``model`` ready for the run, in torchtitan's order; route its training forward through the wrapper.

        Move to the device (:meth:`model_to_device`; FSDP: every rank takes rank 0's weights) →
        the precision's module conversion (float8) → :meth:`parallelize`
        (tensor parallel) → activation checkpointing → compile (whole or per block) →
        :meth:`wrap_model` (DDP / FSDP sharding). Every step but the last edits the user's
        model in place.

        Returns:
            The model the loops call (possibly a wrapper); the optimizer is built after this,
            over :meth:`unwrap_model`'s parameters.
        """
        from trainwright.model.activation_checkpointing import apply_activation_checkpointing
        from trainwright.model.compile import apply_compile

        model = self.model_to_device(model)
        self.unwrapped = model
        self.precision.convert_module(model)
        self.precision.check_setup(compiled=bool(compile))
        self.parallelize(model)
        apply_activation_checkpointing(model, activation_checkpointing)
        apply_compile(model, compile)
        self.model = self.wrap_model(model)
        self._route_forward(self.model)
        return self.model

    def _route_forward(self, caller: nn.Module | None) -> None:
        """Tell the user's model that its training forward goes through ``caller`` (a wrapper holding it; None:
        itself)."""
        set_caller = getattr(self.unwrapped, "set_forward_caller", None)
        if set_caller is not None:
            set_caller(None if caller is self.unwrapped else caller)

    def setup_optim_wrapper(self, optim_wrapper: Any) -> Any:
        """Make this strategy carry out the updates of ``optim_wrapper`` (a wrapper or an OptimWrapperDict); returns
        it."""
        for ow in optim_wrappers_of(optim_wrapper).values():
            ow.strategy = self
        return optim_wrapper

    def model_to_device(self, model: nn.Module) -> nn.Module:
        """Move the model (and tell its data preprocessor the device)."""
        model = model.to(self.device)
        set_preprocessor_device(model, self.device)
        return model

    def parallelize(self, model: nn.Module) -> None:
        """Split layers across devices in place (tensor parallel); nothing here."""

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Wrap for distribution (DDP/FSDP); identity here."""
        return model

    def unwrap_model(self, model: nn.Module | None = None) -> nn.Module:
        """The user's model, without any distributed wrapper."""
        if model is not None and model is not self.model:
            return getattr(model, "module", model)
        if self.model is None:
            raise RuntimeError("Strategy.prepare(model) has not run yet")
        return self.unwrapped

    def side_channel(self, topic: str) -> SideChannel | None:
        """A new client of a store every rank reaches without a collective (for one thread), or None: one process.

        A stall report's heartbeats go through it (``hooks/stall.py``); see
        :class:`~trainwright.dist.side_channel.SideChannel`.
        """
        return None

    def use_process_group(self, backend: str | None = None, timeout_s: float | None = None) -> None:
        """Take ``env_cfg.dist_cfg``'s ``backend`` / ``timeout`` (None: keep this strategy's); one process has no
        process group, so nothing here."""

    def report_failure(self, error: BaseException, where: str = "") -> str:
        """After this process's run failed: tell the other ranks and return what they reported (``"; rank 1 failed:
        ..."``); one process has no other rank, so ``""``."""
        return ""

    def dump_collective_trace(self, folder: Path) -> Path | None:
        """Write the backend's record of recent collectives (NCCL's flight recorder) into ``folder``; the file, or None
        when the backend keeps none."""
        return None

    def teardown(self) -> None:
        """Release what this run acquired (a distributed wrapper, a pending write); called by ``Trainer.close()``.

        A process group joined from a launcher's environment is not left here: later Trainers
        of the process join it (see :class:`~trainwright.strategies.DDPStrategy`).
        """
        self.wait_for_checkpoint()
        if self._ckpt_writer is not None:
            self._ckpt_writer.release()  # the staging buffers: one checkpoint's worth of host memory
        if self.model is not None:
            self._route_forward(None)

    # -- updates ----------------------------------------------------------------------------
    def clip_grad(self, clip: ClipFn, params: list[torch.Tensor]) -> torch.Tensor | None:
        """Clip ``params``' gradients with ``clip`` in the model's parameter order (see :meth:`in_model_order`);
        return their total norm."""
        return clip(self.in_model_order(params))

    def in_model_order(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """``params`` in the order of the prepared model's ``parameters()``; any the model does not hold last, as given.

        The total gradient norm sums the per-parameter norms in the order it gets them, and an
        optimizer's groups may hold them in another (decay / no-decay groups): in the model's
        order the norm, and so the clipped gradients, are bitwise those of a loop calling
        ``clip_grad_norm_(model.parameters(), max_norm)``. The positions are computed once
        per model; the sort is linear when the groups already follow the model.
        """
        model = getattr(self, "unwrapped", None)
        if model is None:
            return params
        if self._param_positions is None or self._param_positions[0] is not model:
            self._param_positions = (model, {id(p): i for i, p in enumerate(model.parameters())})
        positions = self._param_positions[1]
        known = sorted((p for p in params if id(p) in positions), key=lambda p: positions[id(p)])
        return known if len(known) == len(params) else known + [p for p in params if id(p) not in positions]

    # -- collectives (identity on one process) ---------------------------------------------
    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """Reduce a tensor over processes (identity here)."""
        return tensor

    def gather_object(self, obj: Any) -> list[Any]:
        """Gather a picklable object from every process (``[obj]`` here)."""
        return [obj]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Broadcast a picklable object from ``src`` (identity here)."""
        return obj

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's ``tensor`` (same shape everywhere), stacked in rank order on the CPU: ``[world, *shape]``.

        The agreement's one collective per metric-store flush (decisions and logged numbers together).
        """
        return tensor.detach().unsqueeze(0)

    def barrier(self) -> None:
        """Wait for every process (no-op here)."""

    def any_true(self, flag: bool) -> bool:
        """True if ``flag`` is true on any process: the one agreement point for stop decisions."""
        return flag

    # -- state ----------------------------------------------------------------------------
    def model_state_dict(self) -> dict[str, Any]:
        """The full (unsharded) model state dict, on CPU-compatible tensors."""
        return self.unwrap_model().state_dict()

    def full_model_state_dict(self) -> dict[str, Any]:
        """The full (gathered) model weights on rank 0 (what ``Trainer.save_weights`` exports); a collective under
        sharding.

        Called on every rank; ranks other than 0 may get an empty dict.
        """
        return self.model_state_dict()

    def load_model_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Load a full model state dict into the unwrapped model."""
        return self.unwrap_model().load_state_dict(state_dict, strict=strict)

    def optim_state_dict(self, optim_wrapper: Any) -> dict[str, Any]:
        """The optim wrapper's full state (optimizer, GradScaler, partial gradients)."""
        return optim_wrapper.state_dict()  # type: ignore[no-any-return]

    def load_optim_state_dict(self, optim_wrapper: Any, state: Mapping[str, Any]) -> None:
        """Load a state returned by :meth:`optim_state_dict` into the optim wrapper."""
        optim_wrapper.load_state_dict(state)

    # -- checkpoint I/O -------------------------------------------------------------------
    def save_checkpoint(
        self,
        path: str | Path | RemotePath,
        state: Mapping[str, Any],
        *,
        async_save: bool = False,
        after: Callable[[], None] | None = None,
    ) -> None:
        """Write ``state`` to ``path``: complete or absent; rank 0 writes under several processes.

        Called on every rank with the same ``path``. A synchronous save first finishes a
        pending background write (so files complete in the order they were asked for),
        writes atomically, runs ``after`` and waits for every process; the file is in place on
        return and its fsyncs run in the background (:mod:`trainwright.checkpoint.durability`:
        waited for by the next save and by :meth:`wait_for_checkpoint`). With ``async_save``
        the call returns once the tensors are copied to CPU memory; the write and then
        ``after`` run in a background thread, at most one write in flight (see
        :mod:`trainwright.checkpoint.async_writer`).

        A URL ``path`` (``s3://...``, :func:`~trainwright.checkpoint.storage.location`) is serialised
        locally and uploaded as one object (in the background thread with ``async_save``); an
        upload that keeps failing leaves the file in ``work_dir/checkpoints_unuploaded`` and skips
        ``after`` (see :func:`~trainwright.checkpoint.remote_io.save_remote`).

        Args:
            path: The target file.
            state: The checkpoint dict (may share tensors with the live model).
            async_save: Write in the background.
            after: Runs on rank 0 once the file is complete (e.g. updates the ``latest``
                pointer, deletes old checkpoints); skipped if the write failed.
        """
        from trainwright.checkpoint.storage import RemotePath, location

        remote = location(path)  # a RemotePath carries its store; a URL string gets a new one
        if self.is_main_process and isinstance(remote, RemotePath):
            from trainwright.checkpoint.remote_io import save_remote

            target = remote
            if async_save:
                self._async_writer().submit(
                    state, target.url, write=lambda data, _url: save_remote(data, target, after)
                )
            else:
                self.wait_for_checkpoint()
                save_remote(state, target, after)
        elif self.is_main_process and isinstance(remote, Path):
            if async_save:
                self._async_writer().submit(state, remote, after=after)
            else:
                from trainwright.checkpoint.io import atomic_save

                self.wait_for_checkpoint()
                atomic_save(state, remote, durable=False)  # in place now; fsynced in the background
                if after is not None:
                    after()
        if not async_save:
            self.barrier()

    def _async_writer(self) -> AsyncCheckpointWriter:
        """The background writer, made by the first async save (its staging buffers are reused by the next ones)."""
        if self._ckpt_writer is None:
            from trainwright.checkpoint.async_writer import AsyncCheckpointWriter

            self._ckpt_writer = AsyncCheckpointWriter()
        return self._ckpt_writer

    def wait_for_checkpoint(self) -> None:
        """Block until a background write (if any) and the background fsyncs are complete; re-raise their error."""
        from trainwright.checkpoint.durability import wait_durable

        if self._ckpt_writer is not None:
            self._ckpt_writer.wait()
        wait_durable()

    def load_checkpoint(self, path: str | Path | RemotePath, map_location: Any = "cpu") -> dict[str, Any]:
        """Read the checkpoint at ``path`` to restore it (resume, rollback): here :meth:`read_checkpoint`.

        Sharded strategies override it: each rank loads the shards it owns, a collective.
        """
        return self.read_checkpoint(path, map_location)

    def read_checkpoint(self, path: str | Path | RemotePath, map_location: Any = "cpu") -> dict[str, Any]:
        """Read the checkpoint at ``path`` whole, in this process alone (no collective), without executing code from it.

        See :func:`~trainwright.checkpoint.load_file`. A sharded checkpoint directory
        (``iter_8.dcp``, written by the FSDP strategy) is read into this one process as full
        tensors, without a process group (see :func:`trainwright.strategies.dcp_io.load_full`):
        what one rank reads alone (publishing a checkpoint) under every strategy. ``path`` may
        be a URL (``s3://...``).
        """
        from trainwright.checkpoint.storage import location

        loc = location(path)
        if (loc / ".metadata").is_file():  # a DCP directory (dcp_io.is_dcp_checkpoint, without importing DCP)
            from trainwright.strategies.dcp_io import load_full

            return load_full(loc)
        from trainwright.checkpoint.io import load_file

        return load_file(loc, map_location=map_location)

    def remove_checkpoint(self, path: str | Path | RemotePath) -> None:
        """Delete a checkpoint this strategy wrote (a file here; a directory under a sharded strategy), local or in
        its store; missing is fine."""
        from trainwright.checkpoint.storage import remove

        remove(path)

    def find_resumable(self, ckpt_dir: str | Path | RemotePath) -> tuple[Location, dict[str, Any]] | None:
        """The newest checkpoint of ``ckpt_dir`` that loads, as ``(path, checkpoint)``; None when there is none.

        See :func:`~trainwright.checkpoint.find_resumable`: corrupt files are skipped with a
        warning (printed by rank 0, and by another rank when it names that rank: a node-local
        copy only that rank cannot read; see ``rank_zero_warnings``), a refused
        (unsafe) file is an error. Candidates end in :attr:`resumable_suffixes`: here ``*.pth``
        files and the ``*.dcp`` directories of a sharded (FSDP) run, read whole
        (:meth:`load_checkpoint`), so a run continues on one process, or under DDP, where a
        sharded run stopped.
        """
        from trainwright.checkpoint.listing import find_resumable

        return find_resumable(ckpt_dir, suffix=self.resumable_suffixes, load=self.load_checkpoint)

    def collect_env(self) -> dict[str, Any]:
        """Facts about the environment worth logging at start."""
        import platform
        import sys

        env = {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "torch": torch.__version__,
            "device": str(self.device),
            "strategy": self.name,
            "world_size": self.world_size,
            "seed": self.seed,
        }
        if torch.cuda.is_available():
            env["cuda"] = torch.version.cuda
            env["gpu"] = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
        return env
