"""Retention that never fills the disk: thinning old checkpoints to weights, and the free-space preflight.

``keep=dict(last=3, weights_every=10)`` keeps the newest 3 periodic checkpoints whole; an older one whose number
(the ``N`` of ``iter_N.pth`` / ``epoch_N.pth``) is a multiple of ``weights_every`` is thinned to its weights
(``meta`` and ``model``, in ``<ckpt_dir>/weights/<name>``, not a resume candidate) and every other older one is
deleted, each only once the new checkpoint is complete and durable. :func:`preflight` compares, before training,
the free space of the checkpoint folder with what the run will keep and refuses a run that cannot fit.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from trainwright.checkpoint.io import write_whole
from trainwright.checkpoint.storage import Location, RemotePath
from trainwright.dist.shards import local

#: The folder inside the checkpoint folder that holds thinned (weights-only) checkpoints.
WEIGHTS_DIR = "weights"
#: The pieces a thinned checkpoint keeps.
WEIGHTS_PIECES: tuple[str, ...] = ("meta", "model")


class CheckpointSpaceError(OSError):
    """The checkpoints a run will keep do not fit in the free space of their folder (raised before training)."""


@runtime_checkable
class ReportsFreeSpace(Protocol):
    """A :class:`~trainwright.checkpoint.store.Store` that can tell its free space (optional: object storage
    cannot)."""

    def free_bytes(self, url: str) -> int | None:
        """Bytes free under ``url`` (None: unknown)."""
        ...


@dataclass(frozen=True)
class Retention:
    """What a run keeps: the ``last`` periodic checkpoints whole (-1: all), older ones whose number is a multiple of
    ``weights_every`` as weights only (0: none)."""

    last: int = -1
    weights_every: int = 0

    @classmethod
    def parse(cls, keep: Any) -> Retention:
        """``keep=dict(last=k, weights_every=n)`` (or an int: ``last``) checked.

        Raises:
            ValueError: an unknown key or a value that cannot work, naming the fix.
        """
        if isinstance(keep, int) and not isinstance(keep, bool):
            keep = {"last": keep}
        if not isinstance(keep, Mapping) or set(keep) - {"last", "weights_every"}:
            raise ValueError(
                f"checkpoint keep={keep!r}: give dict(last=k, weights_every=n) (keep the newest k checkpoints whole, "
                "thin older ones whose number is a multiple of n to weights only)"
            )
        last, every = keep.get("last", -1), keep.get("weights_every", 0)
        if not isinstance(last, int) or last == 0 or last < -1:
            raise ValueError(
                f"checkpoint keep last={last!r}: keep k >= 1 checkpoints whole (-1: all); 0 would delete every "
                "checkpoint"
            )
        if not isinstance(every, int) or every < 0:
            raise ValueError(f"checkpoint keep weights_every={every!r}: give n >= 1 (0: thin none, delete them)")
        if every and last == -1:
            raise ValueError(
                f"checkpoint keep weights_every={every} needs last=k: with every checkpoint kept whole none is thinned"
            )
        return cls(last=last, weights_every=every)

    def thinned(self, name: str) -> bool:
        """Whether the periodic checkpoint ``name``, once older than the last k, is kept as weights."""
        from trainwright.checkpoint.listing import step_of

        step = step_of(name)
        return self.weights_every > 0 and step > 0 and step % self.weights_every == 0


def thin_to_weights(read: Callable[[Location], Mapping[str, Any]], path: Location) -> Location:
    """Write ``path``'s ``meta`` and ``model`` as ``<folder>/weights/<name>.pth`` (complete and durable on return;
    a sharded ``.dcp`` checkpoint is read whole and written as one file) and return it; the caller deletes ``path``
    afterwards."""
    ckpt = read(path)
    buf = io.BytesIO()
    torch.save({k: ckpt[k] for k in WEIGHTS_PIECES if k in ckpt}, buf)
    out = path.parent / WEIGHTS_DIR / f"{path.stem}.pth"
    if isinstance(out, Path):
        out.parent.mkdir(parents=True, exist_ok=True)
    write_whole(out, buf.getvalue())
    return out


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in ``obj`` (nested dicts, lists, tuples); a storage shared by several counts once.

    A sharded tensor (an FSDP2 ``DTensor``, which has no storage of its own) counts its whole size, as its checkpoint
    holds every process's shard; two sharing this process's shard (tied weights) count once.
    """
    seen: set[tuple[str, int]] = set()
    total = 0
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            shard = local(x)
            key = (str(shard.device), shard.untyped_storage().data_ptr())
            if key not in seen or not shard.numel():
                seen.add(key)
                total += x.numel() * x.element_size()
        elif isinstance(x, Mapping):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total


def free_bytes(where: Location) -> int | None:
    """Free bytes where ``where`` is: ``shutil.disk_usage`` of its nearest existing folder on local disk; the store's
    ``free_bytes`` (:class:`ReportsFreeSpace`) for a store that tells; None when unknown."""
    if isinstance(where, RemotePath):
        return where.store.free_bytes(where.url) if isinstance(where.store, ReportsFreeSpace) else None
    p = Path(where).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def preflight(
    where: Location,
    full: int,
    weights: int,
    retention: Retention,
    saves: list[int] | None,
    free: int | None,
    *,
    existing: int = 0,
    at: int | None = None,
    measured: bool = False,
) -> str | None:
    """Why the run's checkpoints would not fit (None: they fit, or the free space is unknown).

    Args:
        where: The checkpoint folder (named in the message).
        full: Bytes of one checkpoint (the state's tensors).
        weights: Bytes of one weights-only copy.
        retention: What is kept.
        saves: The numbers (``N`` of ``iter_N``) of the periodic saves the run will make (None: unknown; only what
            ``last`` keeps is counted).
        free: Free bytes there (None: unknown).
        existing: Whole checkpoints already in the folder (the free space excludes them; ``last`` counts them).
        at: The iteration training stopped at, for a check during the run (None: before training).
        measured: ``full`` is a checkpoint file's size (else the state's tensor bytes).
    """
    if free is None:
        return None
    if retention.last == -1:
        if saves is None:
            return None
        n_full, n_weights, how = len(saves) + 1, 0, f"keeping all {len(saves)} periodic checkpoints (+ the last)"
    else:
        n_full = max(0, retention.last + 1 - existing)
        every = retention.weights_every
        n_weights = sum(1 for n in saves[: -retention.last] if n > 0 and n % every == 0) if every and saves else 0
        on_disk = f"; {existing} on disk already" if existing else ""
        how = f"keeping the last {retention.last} whole (+ 1 being written{on_disk})" + (
            f" and about {n_weights} weights-only copies (every {retention.weights_every})" if n_weights else ""
        )
    need = n_full * full + n_weights * weights
    if need <= free:
        return None
    return (
        f"The checkpoints of this run will not fit in {where}: one holds about {_size(full)} ("
        f"{'the newest on disk' if measured else 'its tensors'}; the "
        f"weights {_size(weights)}), {how} needs {_size(need)} more, but only {_size(free)} are free. "
        + (
            "Nothing was trained. "
            if at is None
            else f"Training stopped at iteration {at}; the checkpoints written so far are kept (resume=True continues "
            "once there is room). "
        )
        + "Free space there, keep fewer (Trainer(checkpoint=dict(keep=dict(last=2, weights_every=10))) or "
        "default_hooks.checkpoint.keep), or give an out_dir on a larger disk (CheckpointHook(preflight=False) skips "
        "this check)"
    )
