"""FSDPStrategy: fully sharded data parallel (PyTorch FSDP2, ``torch.distributed.fsdp.fully_shard``).

Every rank holds a shard (dim 0) of each parameter, of its gradient and of the optimizer state.
``prepare`` shards the model in place (the ``shard_modules`` units, then the root); the optimizer
is built afterwards over the sharded parameters. Checkpoints are DCP directories
(:mod:`trainwright.strategies.dcp_io`) that load at any world size. See docs/parallelism.md.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from trainwright.amp.precision import Precision
from trainwright.dist.shards import is_sharded
from trainwright.optim.engine import ClipFn
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.registry import STRATEGIES
from trainwright.strategies import fsdp_checkpoint
from trainwright.strategies.process_group import ProcessGroupStrategy
from trainwright.strategies.tensor_parallel import TensorParallel, apply_plan, check_divisible, grads_on_mesh, mesh_for

if TYPE_CHECKING:
    from trainwright.checkpoint.storage import RemotePath


@contextlib.contextmanager
def _no_grad_sync(model: nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def _described(layout: tuple[tuple[int, ...], str] | None) -> str:
    return "absent" if layout is None else f"of shape {layout[0]}, {layout[1]}"


class ModelsDisagreeError(RuntimeError):
    """The processes built models whose parameters or buffers differ in name, shape or dtype (raised on every rank at
    once)."""

    #: Raised on every rank at the same point: the ranks can still meet in collectives.
    raised_on_every_rank = True


def _take_rank0_state(model: nn.Module, gather_object: Callable[[Any], list[Any]]) -> None:
    """Overwrite ``model``'s parameters and buffers with rank 0's, in place (sharded or meta tensors are left as they
    are).

    Every rank's tensor names, shapes and dtypes are compared first (one gather, as DDP
    verifies parameter shapes): a mismatch is a :class:`ModelsDisagreeError` on every rank
    naming the first tensor that differs, not a broadcast of mismatched tensors.
    """
    named = [
        (n, t) for n, t in (*model.named_parameters(), *model.named_buffers()) if not is_sharded(t) and not t.is_meta
    ]
    layouts = gather_object([(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named])
    for rank, layout in enumerate(layouts):
        if layout != layouts[0]:
            ours, theirs = ({n: (shape, dtype) for n, shape, dtype in lay} for lay in (layouts[0], layout))
            name = next((n for n in {**ours, **theirs} if ours.get(n) != theirs.get(n)), None)
            raise ModelsDisagreeError(
                f"The processes built different models: {name!r} is {_described(ours.get(name))} on rank 0 and "
                f"{_described(theirs.get(name))} "
                f"on rank {rank} ({len(layouts[0])} vs {len(layout)} tensors). Build the same model on every process "
                "(the config "
                "or the code that builds it must not depend on the rank)."
            )
    with torch.no_grad():
        works = [dist.broadcast(t.detach(), src=0, async_op=True) for _, t in named]
        for work in works:
            work.wait()  # type: ignore[union-attr]


@STRATEGIES.register(name=["fsdp", "FSDPStrategy"])
class FSDPStrategy(ProcessGroupStrategy):
    """Fully sharded data parallel (FSDP2) over the processes a launcher started (or one process).

    Args:
        device: Default: ``cuda:LOCAL_RANK`` when CUDA is available, else CPU.
        backend: Process-group backend; default ``"nccl"`` on CUDA, ``"gloo"`` on CPU.
        timeout_s: How long a collective may wait for the other ranks before failing.
        shard_modules: Module classes (or their names) whose instances are sharded as units
            of their own (e.g. the transformer block class), before the root module; by
            default only the root is a unit (all parameters gathered at once).
        reshard_after_forward: Free the gathered parameters after the forward (and gather
            them again for the backward): less memory, more communication.
        mixed_precision: ``MixedPrecisionPolicy`` arguments (``param_dtype``,
            ``reduce_dtype``, ...; dtypes or their names); default: from the run's precision (``bf16-mixed`` →
            ``param_dtype=torch.bfloat16, reduce_dtype=torch.float32``; ``16-mixed`` →
            float16 / float32; ``32``: none).
        tensor_parallel: ``dict(size=N, plan=...)``: 2-D parallelism on a ``(dp, tp)`` mesh of
            ``(world_size / N, N)``. ``plan`` maps module path patterns (``*``: one path
            component) to ``"colwise"``, ``"rowwise"``, ``"sequence"`` or a ``ParallelStyle``,
            or is a callable ``plan(model, tp_mesh)``. ``size`` 1 (or None): no tensor
            parallelism, the plan is not applied. See docs/parallelism.md.

    Inside accumulation windows gradient sync is off; clipping by norm uses the global norm of
    the sharded gradients; float16 uses a ``ShardedGradScaler``. Without a launcher the
    strategy starts a one-process group, so a sharded run can continue on one process. With
    ``tensor_parallel``, ``parallelize`` splits the plan's layers over ``tp``
    (:mod:`trainwright.strategies.tensor_parallel`), FSDP shards over ``dp``, and the data is
    sharded over ``dp`` only.

    An ``async_save`` request of the checkpoint hook writes with ``dcp.async_save``: training
    goes on once the shards are copied to CPU memory; at most one write in flight.
    """

    name = "fsdp"
    backward_collective = "FSDP's gradient reduce-scatter (inside backward)"
    checkpoint_suffix = ".dcp"
    resumable_suffixes = (".dcp",)

    def __init__(
        self,
        device: str | torch.device | None = None,
        backend: str | None = None,
        timeout_s: float = 1800.0,
        shard_modules: Sequence[type[nn.Module] | str] = (),
        reshard_after_forward: bool = True,
        mixed_precision: Mapping[str, Any] | None = None,
        tensor_parallel: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(device, backend=backend, timeout_s=timeout_s)
        self.tensor_parallel = TensorParallel.from_config(tensor_parallel)
        #: The ``(dp, tp)`` mesh of a tensor-parallel run (made by :meth:`setup_env`); None without tensor parallelism.
        self.device_mesh: Any = None
        self.shard_modules = tuple(shard_modules)
        self.reshard_after_forward = reshard_after_forward
        self.mixed_precision = dict(mixed_precision) if mixed_precision is not None else None
        self._writes = fsdp_checkpoint.ShardedWrites()  # the background write in flight and its side process group
        self._optim_wrapper: Any = None  # the optimizers whose state a checkpoint holds (setup_optim_wrapper)

    # -- environment ----------------------------------------------------------------------
    def setup_env(
        self,
        *,
        cudnn_benchmark: bool = False,
        dist_cfg: Mapping[str, Any] | None = None,
        randomness: Mapping[str, Any] | None = None,
    ) -> None:
        """Join the launcher's process group (or start a one-process group when no launcher started this process); with
        tensor parallelism, make the ``(dp, tp)`` mesh.

        Raises:
            ValueError: with tensor parallelism, a world size its size does not divide, or
                ``randomness.diff_rank_seed`` (checked before any process group is joined).
        """
        from trainwright.dist.utils import launched_world_size

        world = dist.get_world_size() if dist.is_initialized() else launched_world_size()
        if self.tensor_parallel.size > 1 and (randomness or {}).get("diff_rank_seed"):
            raise ValueError(
                "randomness.diff_rank_seed=True cannot be used with tensor_parallel: the ranks of a tensor-parallel "
                "group compute one "
                "model replica and must draw the same random numbers (dropout on replicated activations). Drop "
                "diff_rank_seed; "
                "the data shards still differ per data-parallel rank."
            )
        check_divisible(world, self.tensor_parallel.size)  # before any process group is joined
        if not dist.is_initialized() and world <= 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(
                backend=self.backend,
                store=dist.HashStore(),
                rank=0,
                world_size=1,
                timeout=datetime.timedelta(seconds=self.timeout_s),
            )
            self._owns_group = True
        super().setup_env(cudnn_benchmark=cudnn_benchmark, dist_cfg=dist_cfg, randomness=randomness)
        if self.tensor_parallel.size > 1:
            self.device_mesh = mesh_for(self.device.type, self.data_parallel_size, self.tensor_parallel.size)

    # -- process facts --------------------------------------------------------------------
    @property
    def data_parallel_size(self) -> int:
        """Data shards: the world size, or with tensor parallelism the ``dp`` size of the mesh (world size / tp
        size)."""
        return self.world_size // self.tensor_parallel.size

    @property
    def data_parallel_rank(self) -> int:
        """This process's data shard: its rank, or with tensor parallelism its ``dp`` coordinate
        (``init_device_mesh`` puts ranks row-major: rank // tp size)."""
        return self.rank // self.tensor_parallel.size

    def collect_env(self) -> dict[str, Any]:
        """The base facts, and the ``(dp, tp)`` mesh of a tensor-parallel run."""
        env = super().collect_env()
        if self.tensor_parallel.size > 1:
            env["device_mesh"] = {"dp": self.data_parallel_size, "tp": self.tensor_parallel.size}
        return env

    def teardown(self) -> None:
        """Finish a pending checkpoint write, destroy the side group of the background writes, then leave as DDP does.

        The side group is this run's own (the next Trainer makes its own): it is destroyed
        once every rank's last write is complete, so no rank closes it under another's
        collective. The default group stays for later Trainers (see :meth:`ProcessGroupStrategy.teardown`),
        except the one-process group made without a launcher, destroyed here.
        """
        self._writes.close(self)  # after a failed run: no collective (see ProcessGroupStrategy.teardown)
        super().teardown()

    # -- model ----------------------------------------------------------------------------
    def setup_optim_wrapper(self, optim_wrapper: Any) -> Any:
        """Carry out the wrappers' updates (built over the sharded parameters); keep them for the checkpoint's
        optimizer shards."""
        self._optim_wrapper = optim_wrapper
        return super().setup_optim_wrapper(optim_wrapper)

    def adapt_precision(self, precision: Precision) -> Precision:
        """float16: a ``ShardedGradScaler`` (ranks agree on skipping a step whose gradients overflowed), with the
        scaler's settings."""
        return precision.sharded(self.device.type, ShardedGradScaler)

    def clip_grad(self, clip: ClipFn, params: list[torch.Tensor]) -> torch.Tensor | None:
        """Clip with the global norm over every rank's shards; return it as a plain (replicated) tensor, not a DTensor.

        With tensor parallelism the gradients live on the 2-D mesh and its ``dp`` sub-mesh:
        the clip function sees them all on the 2-D mesh (:func:`~trainwright.strategies.tensor_parallel.grads_on_mesh`).
        The norm sums over the parameters in the model's order (:meth:`in_model_order`).
        """
        params = self.in_model_order(params)
        if self.device_mesh is not None:
            params = grads_on_mesh(params, self.device_mesh)
        total = clip(params)
        return total.full_tensor() if hasattr(total, "full_tensor") else total

    def _policy(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.mixed_precision is not None:  # dtypes may be given by name in a config file ("bfloat16")
            return MixedPrecisionPolicy(
                **{
                    k: getattr(torch, v) if isinstance(v, str) and k.endswith("_dtype") else v
                    for k, v in self.mixed_precision.items()
                }
            )
        return MixedPrecisionPolicy(**self.precision.fsdp_mixed_precision())

    def model_to_device(self, model: nn.Module) -> nn.Module:
        """Move the model, then give every rank rank 0's parameters and buffers, as DDP does when it wraps a model.

        ``fully_shard`` keeps each rank's own values of its shard: ranks that built the model
        from different random draws (a script that does not seed, ``diff_rank_seed``) would
        otherwise train a mix of their draws, and under tensor parallelism hold replicas that
        disagree. One broadcast per tensor, once per run, after a check that every rank built
        the same tensors (:class:`ModelsDisagreeError`); nothing with one process.
        """
        model = super().model_to_device(model)
        if self.world_size > 1:
            _take_rank0_state(model, self.gather_object)
        return model

    def parallelize(self, model: nn.Module) -> None:
        """Tensor parallelism: split the plan's layers over the mesh's ``tp`` dimension (in place); nothing without it.

        Raises:
            ValueError: a plan pattern matches no module (the message names paths that exist).
        """
        if (
            self.device_mesh is None or self.tensor_parallel.plan is None
        ):  # a plan is required with size > 1 (checked with the config)
            return
        apply_plan(self.state_module(model), self.tensor_parallel.plan, self.device_mesh["tp"])

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """``fully_shard`` every module of a ``shard_modules`` class, then the root, over the ``dp`` mesh (in place;
        the same object is returned)."""
        from torch.distributed.fsdp import fully_shard

        kwargs = dict(reshard_after_forward=self.reshard_after_forward, mp_policy=self._policy())
        if self.device_mesh is not None:
            kwargs["mesh"] = self.device_mesh["dp"]
        elif self.device.type == "cuda":
            from torch.distributed.device_mesh import init_device_mesh

            kwargs["mesh"] = init_device_mesh("cuda", (self.world_size,))
        wanted = tuple(c for c in self.shard_modules if isinstance(c, type))
        names = {c for c in self.shard_modules if isinstance(c, str)}
        target = self.state_module(model)
        for module in reversed(list(target.modules())[1:]):  # inner units first: FSDP2 shards bottom-up
            if (wanted and isinstance(module, wanted)) or type(module).__name__ in names:
                fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)
        return model

    def unwrap_model(self, model: nn.Module | None = None) -> nn.Module:
        """The user's model (FSDP2 shards it in place: there is no wrapper object)."""
        if model is not None:
            return model
        return super().unwrap_model()

    def no_sync_context(self) -> Callable[[nn.Module], contextlib.AbstractContextManager] | None:
        """``set_requires_gradient_sync(False)`` for the micro-batches inside an accumulation window."""
        model = self.model
        if model is None:
            return None
        return lambda _model: _no_grad_sync(model)

    @property
    def checkpointed_optim_wrapper(self) -> Any:
        """The optim wrapper(s) whose optimizer shards a checkpoint holds (given to :meth:`setup_optim_wrapper`; None
        before)."""
        return self._optim_wrapper

    @staticmethod
    def state_module(model: nn.Module) -> nn.Module:
        """The module whose state dict is saved: a plain module's own, not the adapter's (its keys have no
        ``module.``)."""
        from trainwright.model.base_model import ModuleAdapter

        return model.module if isinstance(model, ModuleAdapter) else model

    # -- state ----------------------------------------------------------------------------
    def model_state_dict(self) -> dict[str, Any]:
        """This rank's shards of the model (DTensors keyed by parameter name)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.state_module(self.unwrap_model()))

    def full_model_state_dict(self) -> dict[str, Any]:
        """The full weights gathered to rank 0 on CPU (other ranks get ``{}``); every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(
            self.state_module(self.unwrap_model()), options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_model_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Load shards (from a sharded checkpoint) or full tensors (every rank keeps its own slice)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.tensor import DTensor

        full = not any(isinstance(v, DTensor) for v in state_dict.values())
        return set_model_state_dict(
            self.state_module(self.unwrap_model()),
            dict(state_dict),
            options=StateDictOptions(full_state_dict=full, strict=strict),
        )

    def optim_state_dict(self, optim_wrapper: Any) -> dict[str, Any]:
        """This rank's shards of the optimizer state (keyed by parameter name) and the precision state.

        Raises:
            RuntimeError: inside an accumulation window (FSDP keeps the unreduced gradients
                of the window to itself): save at a window boundary.
        """
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        module = self.state_module(self.unwrap_model())
        out: dict[str, Any] = {}
        for name, ow in optim_wrappers_of(optim_wrapper).items():
            if not ow.should_update():
                raise RuntimeError(
                    "strategy='fsdp' cannot checkpoint inside a gradient accumulation window (micro-batch "
                    f"{ow.inner_count % ow.accumulative_counts} of "
                    f"{ow.accumulative_counts}): the window's gradients are not reduced yet. Save at window "
                    "boundaries: make the checkpoint "
                    "interval a multiple of accumulative_counts."
                )
            state = {
                "optimizer": get_optimizer_state_dict(module, ow.optimizer),
                "precision": ow.precision.state_dict(),
            }
            if name:
                out[name] = state
            else:
                out = state
        return out

    def load_optim_state_dict(self, optim_wrapper: Any, state: Mapping[str, Any]) -> None:
        """Load a state of :meth:`optim_state_dict` (shards, or full tensors keyed by parameter name)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        from torch.distributed.tensor import DTensor

        module = self.state_module(self.unwrap_model())
        for name, ow in optim_wrappers_of(optim_wrapper).items():
            sub = state[name] if name else state
            opt = sub["optimizer"]
            # full tensors keyed by name (a single-file checkpoint), else shards; an empty state (plain SGD) loads as
            # shards:
            # torch's full-state path needs a tensor to learn the device from
            full = bool(opt.get("state")) and not any(
                isinstance(v, DTensor) for s in opt["state"].values() for v in s.values()
            )
            set_optimizer_state_dict(module, ow.optimizer, opt, options=StateDictOptions(full_state_dict=full))
            ow.precision.load_state_dict(sub.get("precision", {}))

    # -- checkpoint I/O -------------------------------------------------------------------
    def save_checkpoint(
        self,
        path: str | Path | RemotePath,
        state: Mapping[str, Any],
        *,
        async_save: bool = False,
        after: Callable[[], None] | None = None,
    ) -> None:
        """Write a checkpoint directory: every rank its shards (DCP), rank 0 the rest; complete or absent.

        Called on every rank with the same ``path`` (a directory; the checkpoint hook names it ``iter_N.dcp``). With
        ``async_save`` the call returns once the shards are staged in CPU memory; the files
        are published (renamed into place) and ``after`` runs when the write is waited for:
        at the next save, at the end of training, or by :meth:`wait_for_checkpoint`. A remote
        ``path`` (a URL) is written in place (see :func:`~trainwright.strategies.fsdp_checkpoint.save_remote`);
        in the background, it is written locally first and uploaded from a thread, so a failed
        upload leaves a complete local copy in ``work_dir/checkpoints_unuploaded``.
        """
        self._writes.save(self, path, state, async_save=async_save, after=after)

    def wait_for_checkpoint(self) -> None:
        """Block until a background write is complete, then publish it (rank 0) and run its ``after``; re-raise its
        error."""
        self._writes.wait(self)

    def load_checkpoint(self, path: str | Path | RemotePath, map_location: Any = "cpu") -> dict[str, Any]:
        """Read a checkpoint directory: each rank loads the shards it owns now (at any world size); the rest from
        ``trainer_state.pth``.

        Raises:
            CheckpointError: the directory is incomplete or corrupt (on every rank).
            RuntimeError: the saved model's parameter names or shapes differ from this model's (nothing loaded).
            FileNotFoundError: ``path`` does not exist.
        """
        from trainwright.checkpoint.storage import location

        p = location(path)
        if p.is_file():
            return super().load_checkpoint(path, map_location)  # a single-file (full) checkpoint
        return fsdp_checkpoint.load(self, p)

    def remove_checkpoint(self, path: str | Path | RemotePath) -> None:
        """Delete a checkpoint directory (or file), local or remote."""
        from trainwright.checkpoint.storage import remove

        remove(path)
