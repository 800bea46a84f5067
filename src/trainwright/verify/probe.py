"""ResumeProbe: the hook ``verify-resume`` adds to each of its runs (records every step, stops and saves at a given
iteration)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from trainwright.checkpoint.listing import read_latest
from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView

__all__ = ["ResumeProbe", "batch_checksum", "default_stop", "record_file"]

#: A default run longer than this many steps (two long epochs) is cut to :data:`SHORT_RUN` steps.
LONGEST_DEFAULT = 200
SHORT_RUN = 40


def default_stop(max_iters: int, epoch_len: int, epochs: int = 2) -> int:
    """The default length of a verification run: ``epochs`` epochs when that is at most :data:`LONGEST_DEFAULT` steps,
    else :data:`SHORT_RUN` steps; never more than the config's ``max_iters``."""
    wanted = epochs * epoch_len
    return min(max_iters, wanted if wanted <= LONGEST_DEFAULT else SHORT_RUN)


def record_file(folder: str | Path, segment: int, rank: int) -> Path:
    """Where the probe of run segment ``segment`` writes the records of process ``rank``."""
    return Path(folder) / f"segment{segment}.rank{rank}.jsonl"


def batch_checksum(batch: Any) -> str:
    """A checksum of every tensor (dtype, shape, bytes) and other value in ``batch``, in its order: equal batches,
    equal checksums."""
    h = hashlib.sha256()
    _feed(h, batch)
    return h.hexdigest()[:16]


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(value.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        h.update(b"{")
        for k in value:  # the collate order (a dict keeps its keys' order)
            h.update(repr(k).encode())
            _feed(h, value[k])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for v in value:
            _feed(h, v)
        h.update(b"]")
    elif hasattr(value, "tobytes") and hasattr(value, "dtype"):  # a NumPy array
        h.update(f"A{value.dtype}{getattr(value, 'shape', ())}".encode())
        h.update(value.tobytes())
    else:
        h.update(repr(value).encode())


def _scalars(outputs: Any) -> dict[str, str]:
    """The one-element tensors (and floats) of a step's outputs, as exact hex floats."""
    if not isinstance(outputs, Mapping):
        return {}
    out: dict[str, str] = {}
    for k, v in outputs.items():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            out[str(k)] = float(v.item()).hex()  # exact for every float dtype (a Python float is a double)
        elif isinstance(v, float):
            out[str(k)] = v.hex()
    return out


class ResumeProbe(Hook):
    """Records each training step (a checksum of its batch, its loss) to a file, and ends the run at ``stop_at``.

    One line per step, ``{"iter", "batch", "losses"}`` (losses as exact hex floats), one per validation,
    ``{"val": iteration, "metrics"}`` (exact hex floats), after a first
    line ``{"start": iteration, ...}`` with the run's shape (the epoch's length, the accumulation,
    the run's length) and a last line ``{"end": iteration, "checkpoint": path}``. At ``stop_at`` the
    run stops through its run control (the same stop on every rank) and saves a checkpoint there
    with the checkpoint manager (its naming and keep-k), as a preempted run does; a run that ends
    earlier saves where it ends.

    Args:
        record: The file of this process's records.
        stop_at: The iteration after which the run stops and saves (None: :func:`default_stop`).
        epochs: See ``stop_at``.
    """

    priority = "LOWEST"

    def __init__(self, record: str | Path, stop_at: int | None = None, epochs: int = 2) -> None:
        if stop_at is not None and (not isinstance(stop_at, int) or stop_at < 1):
            raise ValueError(f"ResumeProbe stop_at must be an iteration >= 1 or None, got {stop_at!r}")
        self.record = Path(record)
        self.stop_at = stop_at
        self.epochs = epochs
        self._stop = 0  # the iteration this run stops at (stop_at, resolved when training starts)
        self._file: IO[str] | None = None

    def _write(self, line: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(line) + "\n")

    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        loop = require_train_loop(trainer, "ResumeProbe")
        self.record.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.record, "a", encoding="utf-8")  # noqa: SIM115 - closed in after_run
        counts = [ow.accumulative_counts for ow in optim_wrappers_of(trainer.optim_wrapper).values()]
        epoch_len = len(loop.dataloader)
        self._stop = self.stop_at if self.stop_at is not None else default_stop(loop.max_iters, epoch_len, self.epochs)
        self._write(
            dict(
                start=trainer.progress.iteration,
                stop_at=self._stop,
                epoch_len=epoch_len,
                accumulation=max(counts, default=1),
                max_iters=loop.max_iters,
                world_size=trainer.strategy.world_size,
            )
        )
        if trainer.progress.iteration >= self._stop:
            loop.control.request_stop(f"verify-resume: the run starts at or after {self._stop}", agreed=True)

    def after_train_iter(  # noqa: D102
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        it = trainer.progress.iteration
        self._write({"iter": it, "batch": batch_checksum(data_batch), "losses": _scalars(outputs)})
        if it == self._stop:  # every rank reaches it at the same iteration: agreed at once
            require_train_loop(trainer, "ResumeProbe").control.request_stop(
                f"verify-resume: restart at iteration {it}", agreed=True
            )

    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        if metrics is not None and self._file is not None:  # a validation during training (not one cut by a stop)
            self._write({"val": trainer.progress.iteration, "metrics": _scalars(metrics)})

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        manager = trainer.checkpoints
        path: Any = manager.save_now()  # complete on return; None: this iteration is saved already
        if path is None:
            latest = read_latest(manager.ckpt_dir)
            path = manager.ckpt_dir / latest if latest else None
        self._write({"end": trainer.progress.iteration, "checkpoint": None if path is None else str(path)})

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        if self._file is not None:
            self._file.close()
            self._file = None
