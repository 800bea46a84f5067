"""ProcessGroupStrategy: the base of every strategy that runs as several processes (DDP, FSDP2, DeepSpeed).

It joins the process group that a launcher's environment describes: NCCL on CUDA, gloo on CPU;
it holds the ranks and the collectives. Subclasses add how the model is wrapped and how
gradients meet. After a run fails on a process, it makes no collective (the others may be in one
of their own): it leaves its error in the launcher's store (:meth:`~ProcessGroupStrategy.report_failure`).
"""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import sys
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainwright.dist.side_channel import SideChannel, open_side_channel
from trainwright.dist.utils import export_launcher_env
from trainwright.optim.counted_loss import item_factor
from trainwright.strategies.base import Strategy

_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

#: The default process group joined from a launcher's environment (a weak reference: a group the user destroys is not
#: kept
#: alive here); it lives as long as the process, later Trainers join it.
_launcher_group: weakref.ref[Any] | None = None
#: The DDP wrappers made by the strategies of this process (a reducer that outlives its group aborts the process at
#: exit).
live_model_wrappers: weakref.WeakSet[nn.Module] = weakref.WeakSet()


#: The entries of NCCL's flight recorder switched on at process-group init (``TORCH_NCCL_TRACE_BUFFER_SIZE``, unless
#: set).
NCCL_TRACE_ENTRIES = 2000


def _join_launcher_group(backend: str, timeout_s: float, dist_cfg: Mapping[str, Any] | None) -> None:
    """Initialise the default process group from the launcher's environment, once per process; it is destroyed at exit.

    Initialising it again in the same process (the same ``MASTER_ADDR:MASTER_PORT``, a new
    store under the same key prefix) is not reliable in torch: the second rendezvous can
    wait forever. So it is never destroyed between Trainers.
    """
    global _launcher_group
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:  # a rendezvous that never completes is otherwise silent until the timeout
        print(
            f"trainwright: rank {os.environ.get('RANK', '?')} of {world} joins the process group at "
            f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')} ({backend}); it waits up to "
            f"{timeout_s:.0f} s for every process",
            file=sys.stderr,
            flush=True,
        )
    if backend == "nccl":  # NCCL's flight recorder: the last collectives, dumped beside the log on a stall
        os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", str(NCCL_TRACE_ENTRIES))
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s), **dict(dist_cfg or {}))
    if (
        _launcher_group is None
    ):  # the first time in this process (the handler looks at whichever group is the launcher's then)
        atexit.register(_leave_launcher_group)
    _launcher_group = weakref.ref(dist.group.WORLD)


def _is_launcher_group() -> bool:
    """Whether the default process group is the one :func:`_join_launcher_group` made (not one the user's script
    made)."""
    return _launcher_group is not None and dist.is_initialized() and dist.group.WORLD is _launcher_group()


def _leave_launcher_group() -> None:
    """At exit: destroy the launcher's group, unless the user destroyed it already or a DDP wrapper still uses it.

    No barrier: a rank that failed may never come to it (the ranks met at each ``Trainer.close()``).
    """
    if _is_launcher_group():
        gc.collect()
        if (
            not live_model_wrappers
        ):  # a trainer never closed: its reducer must not outlive the group (torch releases both as it exits)
            dist.destroy_process_group()


class ProcessGroupStrategy(Strategy):
    """Setup, ranks and collectives over the processes a launcher started.

    The launcher's environment: torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``; srun / mpirun through
    :func:`~trainwright.dist.utils.export_launcher_env`. The collectives include the
    agreement's ``all_gather``, ``any_true`` and object gather / broadcast. The launcher's
    group is joined once per process and destroyed at interpreter exit (later Trainers of the
    process join it); a group the user's script made is joined and left to the script.

    Args:
        device: Default: ``cuda:LOCAL_RANK`` when CUDA is available, else CPU.
        backend: Process-group backend; default ``"nccl"`` on CUDA, ``"gloo"`` on CPU.
        timeout_s: How long a collective may wait for the other ranks before failing.
    """

    name = "process_group"
    forward_is_local = False  # a sharded strategy's forward is a collective; the replicated DDP says True

    def __init__(
        self, device: str | torch.device | None = None, backend: str | None = None, timeout_s: float = 1800.0
    ) -> None:
        super().__init__(device)
        self.backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
        self.timeout_s = timeout_s
        self._owns_group = (
            False  # a one-process group this strategy made (FSDP without a launcher): destroyed at teardown
        )
        self._store: Any = None  # a client of the launcher's store, opened on an error path (see report_failure)

    # -- environment ----------------------------------------------------------------------
    def setup_env(
        self,
        *,
        cudnn_benchmark: bool = False,
        dist_cfg: Mapping[str, Any] | None = None,
        randomness: Mapping[str, Any] | None = None,
    ) -> None:
        """Join the process group (from the launcher's environment), then seed every rank with rank 0's seed.

        The seed is always rank 0's (one broadcast): a rank given another seed (an explicit
        per-process seed) warns and uses rank 0's, so every rank shuffles the same way. With
        ``diff_rank_seed`` each rank adds its rank to rank 0's seed.
        """
        if not dist.is_initialized():
            export_launcher_env()
            missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
            if missing:
                raise RuntimeError(
                    f"strategy='ddp' needs the environment a launcher sets, but {missing} are not set. Start the "
                    "script with "
                    "torchrun, e.g. `torchrun --nproc_per_node=2 train.py` (or srun / mpirun; with mpirun across "
                    "several machines, "
                    "set MASTER_ADDR to the host of rank 0), or use strategy='single' for one process."
                )
            _join_launcher_group(self.backend, self.timeout_s, dist_cfg)
        randomness = dict(randomness or {})
        given = randomness.get("seed")
        randomness["seed"] = self.broadcast_object(
            int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF if given is None else given
        )
        if given is not None and given != randomness["seed"]:
            warnings.warn(
                f"rank {self.rank} was given seed {given}, rank 0 seed {randomness['seed']}: every rank uses rank 0's "
                "seed, so that all ranks "
                "shuffle the data the same way (each its own shard). For per-rank augmentation use "
                "randomness=dict(diff_rank_seed=True).",
                stacklevel=2,
            )
        super().setup_env(cudnn_benchmark=cudnn_benchmark, dist_cfg=dist_cfg, randomness=randomness)

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))

    @property
    def world_size(self) -> int:
        """Number of processes."""
        return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))

    def teardown(self) -> None:
        """Release the model wrapper and wait for every rank (not after a failed run); the launcher's process group
        stays for later Trainers.

        Initialising the launcher's group again from the same environment is not reliable in
        torch, so it lives as long as the process. A one-process group this strategy made
        itself (FSDP without a launcher) is destroyed here; a group the user's script made is
        the script's to destroy. The wrapper goes first: a DDP reducer that outlives its
        process group aborts the process at exit. After a failed run (:attr:`run_failed`)
        there is no barrier: the other ranks may be waiting in a collective of the run, which
        fails as soon as this process exits, so the job stops in seconds, not after the
        collective timeout.
        """
        super().teardown()
        self.model = None
        gc.collect()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False
        elif _is_launcher_group() and not self.run_failed:
            dist.barrier()  # every rank has finished this run before any goes on to the next (or exits)

    # -- updates --------------------------------------------------------------------------
    def skip_nonfinite(self, loss: torch.Tensor, optim_wrapper: Any) -> bool:
        """Whether every rank skips this micro-batch: its loss is NaN/Inf on any rank (one all-reduce of one number).

        Agreed, so no rank back-propagates (and all-reduces gradients) while another skips:
        the ranks' collectives stay paired and their weights equal. When the skipped
        micro-batch was the one to synchronise its accumulation window, the gradients the
        window accumulated without sync (DDP's ``no_sync``) are averaged over the ranks here,
        as DDP's backward would have done.
        """
        skip = self.any_true(not bool(torch.isfinite(loss).all()))
        if (
            skip
            and optim_wrapper.accumulative_counts > 1
            and optim_wrapper.should_sync()
            and isinstance(self.model, DistributedDataParallel)
        ):
            for p in self.model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= self.world_size
        return skip

    def item_scale(self, items: torch.Tensor) -> torch.Tensor:
        """``world_size / (the window's items summed over every rank)``: one all-reduce of one number, no host sync.

        DDP and FSDP average the gradients over the data-parallel ranks, hence the world size
        as numerator. The ranks of one tensor-parallel group see the same batch, so the sum
        over the world counts each batch once per tensor-parallel rank, and ``world / world_sum``
        is ``dp / dp_sum`` there too.
        """
        total = items.detach().to(self._comm_device, torch.float32, copy=True)
        dist.all_reduce(total)
        return item_factor(total, self.world_size)

    # -- failures -------------------------------------------------------------------------
    def use_process_group(self, backend: str | None = None, timeout_s: float | None = None) -> None:
        """Take ``env_cfg.dist_cfg``'s ``backend`` / ``timeout`` (before the group is joined); ``"nccl"`` off CUDA warns
        and keeps ``"gloo"``."""
        if backend is not None:
            if backend == "nccl" and self.device.type != "cuda":
                warnings.warn(
                    f"env_cfg dist_cfg backend='nccl' needs CUDA, but this run is on {self.device.type!r}: using "
                    "'gloo'",
                    UserWarning,
                    stacklevel=4,
                )
            else:
                self.backend = backend
        if timeout_s is not None:
            self.timeout_s = timeout_s

    def report_failure(self, error: BaseException, where: str = "") -> str:
        """After this process's run failed: mark it (:attr:`run_failed`), leave its error for the others, return theirs.

        No collective. The error goes into the launcher's key-value store (the rendezvous
        store at ``MASTER_ADDR:MASTER_PORT``), a best effort with a 2 s bound; then the errors
        other ranks left there are read, so the rank whose collective failed because a peer
        stopped names that peer's error in its own log.

        Returns:
            ``"; rank 1 failed: ValueError: ..."`` for each other rank that left an error ("" when none did).
        """
        self.run_failed = True
        store = self._open_store()
        if store is None:
            return ""
        prefix = f"trainwright/failed/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        mine = f"{type(error).__name__}{' ' + where if where else ''}: {str(error)[:500]}"
        try:
            store.set(prefix + str(self.rank), mine)
            others = [r for r in range(self.world_size) if r != self.rank]
            found = [r for r in others if store.check([prefix + str(r)])]
            return "".join(f"; rank {r} failed: {store.get(prefix + str(r)).decode(errors='replace')}" for r in found)
        except Exception:  # noqa: BLE001 - a store that is gone (its host process exited) only loses the note
            return ""

    def _open_store(self) -> Any:
        """A client of the launcher's store (None when there is none or it does not answer within 2 s)."""
        if self._store is None:
            host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
            if not host or not port or not dist.is_initialized() or self.world_size == 1:
                return None
            try:
                self._store = dist.TCPStore(
                    host, int(port), is_master=False, timeout=datetime.timedelta(seconds=2), wait_for_workers=False
                )
            except Exception:  # noqa: BLE001 - unreachable: no note, the error itself is still raised
                return None
        return self._store

    def side_channel(self, topic: str) -> SideChannel | None:
        """A new client of the launcher's store (``MASTER_ADDR:MASTER_PORT``; 2 s bound), or None when there is none."""
        return open_side_channel(topic) if self.world_size > 1 else None

    def dump_collective_trace(self, folder: Path) -> Path | None:
        """NCCL only: the flight recorder's dump (``TORCH_NCCL_TRACE_BUFFER_SIZE``, switched on at process-group init)
        as ``folder/nccl_trace_rank<N>.pkl`` (read it with torch's ``torchfrtrace``); None on another backend or when
        torch has no dump to give."""
        if self.backend != "nccl":
            return None
        try:  # torch's documented way to the flight recorder (exists in CUDA builds)
            from torch._C._distributed_c10d import _dump_nccl_trace  # type: ignore[attr-defined]

            data = _dump_nccl_trace()
        except Exception:  # noqa: BLE001 - no recorder in this build / process group: nothing to write
            return None
        path = Path(folder) / f"nccl_trace_rank{self.rank}.pkl"
        path.write_bytes(data)
        return path

    # -- collectives ----------------------------------------------------------------------
    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """All-reduce a copy of ``tensor`` (``"mean"``, ``"sum"``, ``"max"``, ``"min"``)."""
        if op not in _OPS:
            raise ValueError(f"reduce op must be one of {sorted(_OPS)}, got {op!r}")
        out = tensor.detach().clone()
        dist.all_reduce(out, op=_OPS[op])
        return out / self.world_size if op == "mean" else out

    def gather_object(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` stacked in rank order, on the CPU: one collective."""
        t = tensor.detach().to(self._comm_device)
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t)
        return torch.stack(out).cpu()

    @property
    def _comm_device(self) -> torch.device:
        """Where small tensors must live for a collective of this backend (NCCL: the GPU)."""
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def barrier(self) -> None:
        """Wait for every rank."""
        dist.barrier()

    def any_true(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any: one all-reduce of one number."""
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self._comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())
