"""Agreement: the decisions every process takes together - stop, a non-finite loss, write the held log lines.

Each process only proposes (a preemption signal, ``trainer.should_stop``, the logger's clock, a
flush that saw a NaN loss); :meth:`Agreement.exchange` turns the proposals into decisions that are
the same on every process: under several processes one blocking all-gather of a small tensor,
on one process no collective at all (see docs/logging.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from trainwright.logging.flush_batch import FlushBatch

__all__ = ["Agreement", "Gather", "LoggedValuesDisagreeError", "NonFinite"]

#: ``gather(t)``: every process's 1-D float64 tensor ``t`` stacked in rank order, ``[world, n]``
#: (``Strategy.all_gather``).
Gather = Callable[[torch.Tensor], torch.Tensor]

_HEADER = 6  # write, stop, first non-finite iteration (inf: none), fingerprint, count of numbers, finish


class LoggedValuesDisagreeError(RuntimeError):
    """The processes logged different names, or different numbers of values, between two agreement points.

    Raised on every process at the same exchange (each sees every process's fingerprint), so the
    processes stay together and each log names the ranks that differ.
    """

    raised_on_every_rank = True


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
        stop: Agreed: some process proposed a stop (a preemption signal; stays True until :meth:`reset`).
        write: Agreed at the last exchange: some process proposed writing the held log lines.
        finish: Agreed: training ends at this point (``trainer.should_stop``, which a hook sets on one
            rank or all: see :meth:`request_finish`).
    """

    def __init__(self, gather: Gather | None = None, every: int = 10) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(
                f"Agreement every must be an int >= 1 (iterations between agreement points), got {every!r}"
            )
        self.gather = gather
        self.every = every
        self.stop = False
        self.write = False
        self.finish = False
        self._stop_proposed = False
        self._write_proposed = False
        self._finish_proposed = False
        self._size = 0  # the count of numbers agreed at the last exchange (the same on every process)

    @property
    def local(self) -> bool:
        """One process: decisions are taken at once, without a collective."""
        return self.gather is None

    def reset(self) -> None:
        """Forget every proposal and decision (a new training run)."""
        self.stop = self.write = self.finish = self._stop_proposed = self._write_proposed = self._finish_proposed = (
            False
        )

    def request_finish(self, value: bool = True) -> None:
        """``trainer.should_stop = value``: on one process decided at once; under several, proposed to the next
        agreement point.

        A hook may set ``should_stop`` on one rank only (a reason of its own: its loss, a file it
        watches); acting on it there alone would leave the other ranks waiting in a collective.
        """
        self._finish_proposed = bool(value)
        if self.gather is None:
            self.finish = bool(value)

    def set_finish(self, value: bool) -> None:
        """Decide ``finish`` at once, on a point every process reaches with the same value (a new run; a stop agreed
        otherwise)."""
        self.finish = self._finish_proposed = bool(value)

    def agree_finish(self) -> bool:
        """An agreement point of ``finish`` alone (an epoch's end, after a validation); returns it. Several
        processes: one collective."""
        if self.gather is not None:
            everyone = self.gather(torch.tensor([float(self._finish_proposed or self.finish)], dtype=torch.float64))
            self.set_finish(bool(everyone.any()))
        return self.finish

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

        Under several processes the proposals and the flushed numbers travel in one all-gather
        and the numbers are reduced (``data_time`` the maximum, every other scalar the mean); on
        one process nothing is exchanged. The metric store calls it at each flush; under several
        processes the train loop flushes every :attr:`every` iterations and applies the
        decisions there.

        Returns:
            The first iteration whose loss was non-finite on some process and the ranks that saw
            it there, the same on every process (None: none).

        Raises:
            LoggedValuesDisagreeError: the processes logged different names or counts of values (on every process).
        """
        write, stop = self._write_proposed, self._stop_proposed
        bad: float = batch.bad[0] if batch.bad is not None else math.inf
        ranks: tuple[int, ...] = ()
        self._write_proposed = False
        if self.gather is not None:
            numbers, fingerprint = batch.message()
            # A collective needs the same size on every process: the numbers go along when their count is the
            # agreed one (the last exchange's, the same everywhere), else the header alone decides (a changed
            # count: the numbers follow in a second collective; a different count: the error below, everywhere).
            n, size = len(numbers), self._size
            body = numbers if n == size else [0.0] * size
            finish = float(self._finish_proposed or self.finish)
            everyone = self.gather(
                torch.tensor(
                    [float(write), float(stop), bad, float(fingerprint), float(n), finish, *body], dtype=torch.float64
                )
            )
            head = everyone[:, :_HEADER]
            differ = (head[:, 3:5] != head[0, 3:5]).any(1)
            if bool(differ.any()):
                counts = ", ".join(f"rank {r} {int(c)}" for r, c in enumerate(head[:, 4].tolist()))
                raise LoggedValuesDisagreeError(
                    "The processes logged different values between two agreement points: rank(s) "
                    f"{differ.nonzero().flatten().tolist()} "
                    f"logged other names or counts than rank 0 (values: {counts}); this process logged "
                    f"{batch.names.replace(chr(0), ', ') or 'nothing'}. Every process must log the same names at the "
                    "same iterations: "
                    "log a value on every rank (e.g. 0 where it does not apply)."
                )
            if n != size:
                self._size = n
                numbers_of_all = (
                    self.gather(torch.tensor(numbers, dtype=torch.float64)) if n else everyone[:, :0]
                )  # nothing logged: no numbers
            else:
                numbers_of_all = everyone[:, _HEADER:]
            write, stop = bool(head[:, 0].any()), bool(head[:, 1].any())
            self.set_finish(bool(head[:, 5].any()))
            bad = float(head[:, 2].amin())
            ranks = tuple(int(r) for r in (head[:, 2] == bad).nonzero().flatten().tolist())
            batch.reduce(numbers_of_all)
        self.write = write
        self.stop = self.stop or stop
        return None if math.isinf(bad) else NonFinite(int(bad), ranks)
