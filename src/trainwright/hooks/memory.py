"""CUDA memory snapshots of chosen iterations: :class:`MemorySnapshotHook` records CUDA allocation history over a window
of iterations and writes torch's snapshot pickle, for https://pytorch.org/memory_viz. (The per-phase peaks of the
logger's ``max_memory_mb`` are :class:`~trainwright.hooks.phase_peaks.PhasePeaks`.)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainwright.hooks.hook import Hook
from trainwright.hooks.phase_peaks import PhasePeaks
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView

__all__ = ["MemorySnapshotHook", "PhasePeaks"]


@HOOKS.register
class MemorySnapshotHook(Hook):
    """Record CUDA memory allocations over training iterations ``iters`` and write a snapshot for
    https://pytorch.org/memory_viz.

    ``torch.cuda.memory._record_memory_history(max_entries=...)`` starts before the window's
    first iteration; after its last, ``torch.cuda.memory._dump_snapshot(path)`` writes the
    pickle (every allocation and free with its Python / C++ stack, the allocator's segments)
    and recording stops. Drag the file onto https://pytorch.org/memory_viz. When the run ends
    inside the window (an out-of-memory error, a stop), the snapshot is written then, with what
    was recorded: the history up to the failure.

    Needs a CUDA device: on another device the hook says so once, when training starts, and
    writes nothing. Recording costs time (a stack trace per allocation) only inside the window.

    Args:
        iters: ``(first, last)``, 1-based run-wide iterations, inclusive (``(10, 12)``: three
            iterations), or one iteration.
        out: The snapshot file; relative to the run's folder (``trainer.run_dir``). Default
            ``memory_snapshot_iter{first}-{last}.pickle``. Under several processes each
            process writes its own, ``_rank{r}`` added before the suffix.
        max_entries: Allocation events kept (the oldest dropped beyond it).
    """

    priority = (
        "HIGHEST"  # recording starts before every other hook of the first iteration and stops after the last one's step
    )

    def __init__(
        self,
        iters: int | tuple[int, int] | list[int] = (10, 12),
        out: str | Path | None = None,
        max_entries: int = 100_000,
    ) -> None:
        pair = (iters, iters) if isinstance(iters, int) and not isinstance(iters, bool) else tuple(iters)  # type: ignore[arg-type]
        if (
            len(pair) != 2
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in pair)
            or not 1 <= pair[0] <= pair[1]
        ):
            raise ValueError(
                "MemorySnapshotHook iters must be (first, last) iterations with 1 <= first <= last (e.g. (10, 12)), "
                f"or one iteration; got {iters!r}"
            )
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(
                f"MemorySnapshotHook max_entries must be an int >= 1 (allocation events kept), got {max_entries!r}"
            )
        self.iters: tuple[int, int] = (int(pair[0]), int(pair[1]))
        self.out = out
        self.max_entries = max_entries
        self.path: Path | None = None  # where the snapshot goes (set when training starts on CUDA)
        self._recording = False
        self._window = range(0)

    def before_train(self, trainer: TrainerView) -> None:
        """Check the device (a warning naming CUDA otherwise) and the window; decide the file."""
        device = trainer.strategy.device
        self._window = range(0)
        if device.type != "cuda":
            trainer.logger.warning(
                "MemorySnapshotHook needs a CUDA device (torch.cuda.memory._record_memory_history); this run trains "
                f"on {device.type!r}, "
                "so no memory snapshot is written. Run on a GPU, or remove the hook."
            )
            return
        first, last = self.iters
        loop = trainer.train_loop
        if loop is not None and first > loop.max_iters:
            trainer.logger.warning(
                f"MemorySnapshotHook iters={self.iters}: the run ends at iteration {loop.max_iters}, so no memory "
                "snapshot is written. Choose earlier iterations."
            )
            return
        name = Path(self.out) if self.out is not None else Path(f"memory_snapshot_iter{first}-{last}.pickle")
        if trainer.strategy.world_size > 1:
            name = name.with_name(f"{name.stem}_rank{trainer.strategy.rank}{name.suffix}")
        self.path = name if name.is_absolute() else Path(trainer.run_dir) / name
        self._window = range(first, last + 1)

    def train_iter_interval(self, trainer: TrainerView) -> range:  # noqa: D102
        return self._window

    def before_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None) -> None:  # noqa: D102
        if not self._recording and trainer.progress.iteration + 1 >= self._window.start:
            torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
            self._recording = True

    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:  # noqa: D102
        if self._recording and trainer.progress.iteration >= self._window.stop - 1:
            self._dump(trainer)

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._dump(trainer)  # the run ended inside the window

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        self._dump(trainer)  # an error (out of memory...) inside the window: what was recorded up to it

    def _dump(self, trainer: TrainerView) -> None:
        if not self._recording or self.path is None:
            return
        self._recording = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(self.path))
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        trainer.logger.info(
            f"Wrote the CUDA memory snapshot of iterations {self.iters[0]}-{self.iters[1]} to {self.path}: open it at "
            "https://pytorch.org/memory_viz"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(iters={self.iters}, out={self.out!r}, max_entries={self.max_entries})"
