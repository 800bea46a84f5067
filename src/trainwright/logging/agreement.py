"""Agreement: the decisions every process takes together - stop, a non-finite loss, write the held log lines.

Each process only proposes (a preemption signal proposes a stop, the logger's clock proposes
writing lines, a flush notes a NaN loss); :meth:`Agreement.exchange` turns the proposals into
decisions that are the same on every process. Under several processes that is one blocking
all-gather of a small tensor that also carries the flushed numbers (reduced over the processes:
``data_time`` the maximum, every other scalar the mean); on one process no collective at all.
The metric store exchanges at each flush; under several processes the train loop flushes every
:attr:`Agreement.every` iterations and applies the decisions there (see docs/logging.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from trainwright.logging.flush_batch import FlushBatch

__all__ = ["Agreement", "Gather", "NonFinite"]

#: ``gather(t)``: every process's 1-D float64 tensor ``t`` stacked in rank order, ``[world, n]`` (``Strategy.all_gather``).
Gather = Callable[[torch.Tensor], torch.Tensor]

_HEADER = 4  # write, stop, first non-finite iteration (inf: none), fingerprint


class NonFinite(NamedTuple):
    """The first iteration whose loss was non-finite on some process, and which processes saw it there."""

    iteration: int
    ranks: tuple[int, ...]  # the ranks whose loss was non-finite at ``iteration`` (empty on one process)


class Agreement:
    """Proposals in, decisions out, the same on every process.

    Args:
        gather: ``Strategy.all_gather`` under several processes; None on one process (every
            decision is this process's own proposal, nothing is exchanged).
        every: Under several processes, iterations between two agreement points of the train
            loop (a stop, a NaN and the logger's held lines wait at most this long; each point
            is one collective). Default 10: the logger's default interval.

    Attributes:
        stop: Agreed: some process proposed a stop (stays True until :meth:`reset`).
        write: Agreed at the last exchange: some process proposed writing the held log lines.
    """

    def __init__(self, gather: Gather | None = None, every: int = 10) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"Agreement every must be an int >= 1 (iterations between agreement points), got {every!r}")
        self.gather = gather
        self.every = every
        self.stop = False
        self.write = False
        self._stop_proposed = False
        self._write_proposed = False

    @property
    def local(self) -> bool:
        """One process: decisions are taken at once, without a collective."""
        return self.gather is None

    def reset(self) -> None:
        """Forget every proposal and decision (a new training run)."""
        self.stop = self.write = self._stop_proposed = self._write_proposed = False

    def propose_stop(self) -> None:
        """This process asks every process to stop training (safe in a signal handler: it only sets flags)."""
        self._stop_proposed = True
        if self.gather is None:
            self.stop = True

    def propose_write(self) -> None:
        """This process asks for the held log lines to be written at the next exchange."""
        self._write_proposed = True

    def exchange(self, batch: FlushBatch) -> NonFinite | None:
        """Decide from every process's proposals, and reduce ``batch``'s numbers in place over the processes.

        Returns:
            The first iteration whose loss was non-finite on some process and the ranks that saw
            it there, the same on every process (None: none).

        Raises:
            RuntimeError: the processes logged different names or counts of values.
        """
        write, stop = self._write_proposed, self._stop_proposed
        bad: float = batch.bad[0] if batch.bad is not None else math.inf
        ranks: tuple[int, ...] = ()
        self._write_proposed = False
        if self.gather is not None:
            numbers, fingerprint = batch.message()
            everyone = self.gather(torch.tensor([float(write), float(stop), bad, float(fingerprint), *numbers], dtype=torch.float64))
            head = everyone[:, :_HEADER]
            if bool((head[:, 3] != head[0, 3]).any()):
                raise RuntimeError(
                    "The processes logged different values at this flush (other names, or a different number of "
                    f"iterations); this process logged {batch.names.replace(chr(0), ', ') or 'nothing'}. Every process must "
                    "log the same names at the same iterations: log a value on every rank (e.g. 0 where it does not apply)."
                )
            write, stop = bool(head[:, 0].any()), bool(head[:, 1].any())
            bad = float(head[:, 2].amin())
            ranks = tuple(int(r) for r in (head[:, 2] == bad).nonzero().flatten().tolist())
            batch.reduce(everyone[:, _HEADER:])
        self.write = write
        self.stop = self.stop or stop
        return None if math.isinf(bad) else NonFinite(int(bad), ranks)
