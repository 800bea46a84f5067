"""Device memory peaks per phase of a run (training iterations, validation / test passes, checkpoint saves), for the
logger's ``max_memory_mb``: :class:`PhasePeaks` resets the allocator's one peak counter at each phase change."""

from __future__ import annotations

from collections.abc import Callable

import torch

_MIB = 2**20


def _allocator(device: torch.device) -> tuple[Callable[[], int], Callable[[], None]] | None:
    """``(peak bytes allocated, reset the peak)`` of ``device``'s allocator; None when the device reports no peak
    (CPU)."""
    if device.type == "cuda":
        return (lambda: torch.cuda.max_memory_allocated(device)), (lambda: torch.cuda.reset_peak_memory_stats(device))
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accelerator is not None and accelerator.type == device.type and device.type != "cpu":
        index = device.index if device.index is not None else torch.accelerator.current_device_index()
        return (lambda: torch.accelerator.max_memory_allocated(index)), (
            lambda: torch.accelerator.reset_peak_memory_stats(index)
        )
    return None


class PhasePeaks:
    """The peak device memory allocated in each phase of a run, in MiB.

    The allocator keeps one peak counter; this resets it whenever the phase changes, so each
    reading covers one phase only. Phases: ``"train"`` (training iterations; a reading is the
    peak since the previous one, validation and checkpoint saves left out), ``"eval"`` (one
    validation or test pass) and ``"save"`` (one checkpoint save: from the collection of its
    pieces to the next phase change). Reading and resetting the counter are host-side calls
    into the allocator: no device synchronisation.

    Args:
        peak: Returns the allocator's peak since the last reset, in bytes.
        reset: Resets that peak to the memory allocated now.
    """

    def __init__(self, peak: Callable[[], int], reset: Callable[[], None]) -> None:
        self._peak = peak
        self._reset = reset
        self.phase = "train"
        self._train = 0  # bytes: the train phase's peak before the current other phase began

    @classmethod
    def of(cls, device: torch.device) -> PhasePeaks | None:
        """For ``device`` (CUDA, or the current ``torch.accelerator`` device); None where it reports no peak (CPU)."""
        fns = _allocator(device)
        return cls(*fns) if fns is not None else None

    def start(self) -> None:
        """Training starts: count its peak from now (what came before, e.g. building the model, left out)."""
        self.phase = "train"
        self._train = 0
        self._reset()

    def begin(self, phase: str) -> float | None:
        """Start ``phase``; returns the peak (MiB) of the ``"eval"`` / ``"save"`` phase it ends (None when it ends
        training)."""
        ended = self._switch()
        self.phase = phase
        self._reset()
        return ended

    def train_peak(self) -> float:
        """The training iterations' peak (MiB) since the previous call (an open save phase counts in), and start
        counting again."""
        if self.phase != "train":  # a save inside an epoch: the iterations since it run in its phase
            self._switch()
            self.phase = "train"
        peak = max(self._train, self._peak())
        self._train = 0
        self._reset()
        return peak / _MIB

    def _switch(self) -> float | None:
        if self.phase == "train":
            self._train = max(self._train, self._peak())
            return None
        return self._peak() / _MIB
