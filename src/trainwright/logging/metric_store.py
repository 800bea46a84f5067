"""MetricStore: the one owner of logged numbers; tensors stay tensors until a flush.

The train loop hands it each iteration's outputs (losses, other logged tensors) and two
timestamps as one row, appended by :meth:`MetricStore.recorder`'s callable (outside the
loop: :meth:`MetricStore.record`). Tensors are kept as they are - no
``.item()``, no host-device sync - and turned into numbers in one batch when the store is
flushed. The flush also derives each iteration's ``data_time`` and ``time`` from the
timestamps and detects a non-finite loss.

Every flush happens at an iteration count that is the same on every process (never
because of one process's clock). Under several processes each flush is ONE collective
(``Strategy.all_gather`` of a small tensor, given by the trainer) that carries everything
the processes must agree on: "write the log lines now?" (each process's clock only
proposes), "stop?" (a preemption signal one process received), "did a loss go NaN/Inf?",
and the flushed numbers themselves, which come back reduced over the processes
(detectron2 semantics: ``data_time`` is the maximum over processes - the slowest loader
holds everyone up - every other scalar the mean). So all processes convert, log the same
numbers, stop and raise at the same iteration, and none is left waiting in a collective.
Between flushes nothing is exchanged.

The collective of :meth:`MetricStore.flush_if` / :meth:`MetricStore.agree` (the logging
and preemption-check iterations) is made only at *agreement points*, about ``agree_secs``
apart (1 s by default): a call between two points exchanges nothing (a ``due`` proposal is
held for the next point). The spacing is decided from data every process has: each
collective also carries this process's proposal (how many iterations fit in ``agree_secs``
at its measured pace, at most ``flush_every``); from an applied answer every process takes
the same gap (the smallest proposal) and the next point is the current iteration + gap. So
all processes agree at the same iterations. Until an answer with a pace was applied (the
first calls of a run), and with ``agree_secs=0``, every call is an agreement point.

The collective of an agreement point is pipelined: it is started without waiting, and its
answer - complete by then - is applied at the next agreement point, on every process at
that same iteration. So the lines, the stop and the NaN error carried by agreement k are
taken at agreement k + 1: within about two ``agree_secs`` (at most 2 x ``flush_every``
iterations) of the iteration concerned. The blocking flushes (epoch ends, the end of
training, before evaluation results and checkpoints, the train loop's flush at every
``flush_every``-th iteration, error paths) first wait for the answer in flight, so nothing
is lost, and settle everything at once; a blocking flush that exchanged rows agrees on
everything a point does, so the next point counts from it (when the gap is capped at
``flush_every``, the points fall on the loop's flushes: one collective per
``flush_every`` iterations).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from trainwright.logging.flush_batch import FlushBatch, Row, derive_times
from trainwright.logging.history_buffer import HistoryBuffer

__all__ = ["Gather", "HistoryBuffer", "MetricStore", "Row"]

#: ``gather(t)`` starts the collective of a 1-D float64 tensor and returns ``wait``; ``wait()`` gives every
#: process's tensor stacked in rank order, ``[world, n]`` (``Strategy.all_gather_async``).
Gather = Callable[[torch.Tensor], Callable[[], torch.Tensor]]


class MetricStore:
    """Named :class:`HistoryBuffer` s fed with tensors that are converted lazily.

    Pseudocode of the life of a logged value::

        record(it, outputs, t_start, t_end)   # hot path: a list append; tensors stay on the device
        ...
        flush()                               # pending tensors → numbers (one transfer per device),
                                              # timestamps → data_time / time, buffers extended
                                              # (iterations kept beside the values), then a NaN/Inf
                                              # loss on any process → FloatingPointError on all

    It flushes by itself every ``flush_every`` recorded iterations (bounds memory), and when
    asked: at logging iterations through :meth:`flush_if`, at epoch ends and the end of
    training (the loops), before evaluation results are logged, before a checkpoint
    (:meth:`state_dict`). Each of these points is the same iteration on every process; under
    several processes each is one collective (see the module docstring; :meth:`flush_if`'s
    only at agreement points, about ``agree_secs`` apart, answered at the next one), on one
    process none.

    Args:
        window_size: Values ``median`` / ``mean`` of each buffer look at by default.
        flush_every: Convert pending tensors after this many recorded iterations at the
            latest, so memory stays bounded whoever asks for numbers.
        raise_on_nonfinite: On flush, raise :class:`FloatingPointError` when a value whose
            name contains ``"loss"`` is NaN or infinite.
        gather: ``gather(t) -> wait``, starts the collective of every process's 1-D float64
            tensor ``t``; ``wait()`` returns them ``[world, n]`` in rank order
            (``Strategy.all_gather_async``, passed in by the trainer under several processes;
            None: one process, nothing to agree on). Every process calls it at the same
            flushes, with tensors of the same length: every process logs the same names.
        agree_secs: Under several processes, the seconds between two agreement points of
            :meth:`flush_if` / :meth:`agree` (see the module docstring); 0: every call agrees.
            The same on every process is not required (the smallest proposal wins).

    Attributes:
        stop_requested: Set by this process (e.g. a preemption signal handler) to propose a
            stop; carried by the next flush.
        stop_agreed: True on every process from the applied answer that carried some
            process's request on (on one process: from the next :meth:`flush_if`; under
            several: from the agreement point after the one that carried it, or a flush).
        synced_at: Iteration of the newest row an agreeing collective carries, started or
            applied (-1: none yet). A hook that needs an agreement at this iteration calls
            :meth:`agree` only when this is older, so an iteration has at most one collective.
    """

    def __init__(
        self, window_size: int = 20, flush_every: int = 1000, raise_on_nonfinite: bool = True, gather: Gather | None = None, agree_secs: float = 1.0
    ) -> None:
        if agree_secs < 0:
            raise ValueError(f"MetricStore agree_secs must be >= 0 (seconds between agreement points; 0: agree at every call), got {agree_secs}")
        self.window_size = window_size
        self.flush_every = flush_every
        self.raise_on_nonfinite = raise_on_nonfinite
        self.gather = gather
        self.agree_secs = agree_secs
        self.stop_requested = False
        self.stop_agreed = False
        self.synced_at = -1
        self._history = 0
        self._buffers: dict[str, HistoryBuffer] = {}
        self._pending: list[Row] = []
        self._prev_end: float | None = None  # end of the last timed iteration; None: not timing
        self._clock_starts: dict[int, float] = {}  # pending index → when the clock (re)started before it
        self._untimed_to = 0  # iterations up to this one get no data_time / time (the timer's warm-up)
        self._in_flight: tuple[FlushBatch, Callable[[], torch.Tensor]] | None = None  # the last flush_if's batch and collective
        self._write_agreed = False  # an applied answer said "write", not returned by flush_if yet
        self._due = False  # a flush_if call between agreement points proposed "write"; carried by the next point
        self._pace: float | None = None  # seconds per iteration of this process, from the last timed rows carried
        self._gap = 0  # iterations between agreement points, from the last applied answer (0: every call)
        self._next_agree = 0  # the next agreement point: the first call at this iteration or later agrees

    # -- recording --------------------------------------------------------------------------
    def record(self, iteration: int, outputs: Mapping[str, Any], t_start: float | None, t_end: float | None) -> None:
        """Record one training iteration: its outputs (tensors or numbers) and its timestamps; no host sync.

        Args:
            iteration: The iteration the values belong to (1 for the first step).
            outputs: Named values, e.g. ``{"loss": tensor}``; tensors stay tensors until the flush.
            t_start: ``time.perf_counter()`` before the iteration's ``before_train_iter`` hooks
                (the batch has just arrived); ``data_time`` is measured up to it.
            t_end: ``time.perf_counter()`` right after the step; ``time`` is measured up to it.
                Both are measured from the previous iteration's ``t_end`` (or from
                :meth:`start_clock`), and only once the clock was started.
        """
        pending = self._pending
        pending.append((iteration, outputs, t_start, t_end))
        if len(pending) >= self.flush_every:
            self.flush()

    def recorder(self, period: int = 1) -> Callable[[Row], None]:
        """The callable the train loop records a row ``(iteration, outputs, t_start, t_end)`` with, chosen once per run.

        With ``period=1`` it is the append of the store's list of pending rows (no Python
        frame per step): it does not flush, so its caller flushes every :attr:`flush_every`
        iterations (the train loop does, on the hooks' schedule). With ``period > 1`` only
        iterations whose number is a multiple of ``period`` are recorded (detectron2's
        ``SimpleTrainer(gather_metric_period=...)``); the others keep no reference to their
        outputs. A recorded iteration's ``data_time`` / ``time`` are still its own (measured
        from the end of the iteration before it).

        Raises:
            ValueError: ``period`` is not an int >= 1.
        """
        if not isinstance(period, int) or period < 1:
            raise ValueError(f"gather_metric_period must be an int >= 1 (record step outputs every N iterations), got {period!r}")
        pending = self._pending  # the one list of this store: a flush empties it in place
        if period == 1:
            return pending.append

        def record_every(row: Row) -> None:
            if row[0] % period == 0:
                pending.append(row)
            elif row[3] is not None and (self._prev_end is not None or self._clock_starts):  # timing: the next row counts from here
                self._clock_starts[len(pending)] = row[3]

        return record_every

    def skip_times_until(self, iteration: int) -> None:
        """Derive no ``data_time`` / ``time`` for iterations up to and including ``iteration`` (a warm-up).

        The iteration timer calls it at the start of training with the last warm-up iteration
        (detectron2's ``IterationTimer(warmup_iter=...)``); the clock still runs through them.
        """
        self._untimed_to = iteration

    def update_dict(self, values: Mapping[str, Any], iteration: int) -> None:
        """Record named values (tensors or numbers) of ``iteration`` without timing; no host sync."""
        self.record(iteration, values, None, None)

    def update_scalar(self, name: str, value: float, iteration: int = -1) -> None:
        """Record a plain Python number right away (e.g. the validation time)."""
        self.buffer(name).update(value, iteration)

    def start_clock(self, now: float) -> None:
        """Time the iterations recorded from now on: the next one's ``data_time`` and ``time`` count from ``now``.

        The iteration timer calls it at each epoch start and after validation, so neither
        the time before the epoch nor the validation counts as waiting for data.
        """
        self._clock_starts[len(self._pending)] = now

    def keep_history(self, n: int) -> None:
        """Make every buffer keep at least its last ``n`` values with their iterations.

        For readers that compute over ranges of iterations after a flush, e.g. the logger's
        interval means of lines written in batches (it asks at ``before_train``).
        """
        self._history = max(self._history, n)
        for b in self._buffers.values():
            b.keep(self._history)

    def buffer(self, name: str) -> HistoryBuffer:
        """The buffer of ``name``, created empty if it does not exist yet."""
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = HistoryBuffer(self.window_size, self._history)
        return buf

    # -- sync points ------------------------------------------------------------------------
    @property
    def pipelined(self) -> bool:
        """Whether :meth:`flush_if` answers one call late (several processes: the agreement is in flight between calls)."""
        return self.gather is not None

    def flush_if(self, due: bool, *, iteration: int) -> bool:
        """Flush, and agree whether ``due`` is true on any process; every process gets the same answer.

        For decisions taken from a process's own clock (the logger writes lines at most once a
        ``flush_secs``): the lines are written at the same iteration everywhere. On one
        process the store flushes only when ``due`` and answers at once. Under several
        processes only a call at an agreement point (see ``agree_secs``) does anything,
        pipelined: it starts the collective of this call without waiting for it (the pending
        numbers, ``due`` - or'ed with the ``due`` of the calls since the previous point - and
        a :attr:`stop_requested` travel in it) and applies the answer of the previous point,
        complete by now: the buffers then hold the (reduced) numbers up to the previous point,
        :attr:`stop_agreed` and a non-finite loss are decided from it, and the return value is
        its ``due`` (sticky until a call returns it, so a call whose caller does not write
        lines loses no decision; :meth:`agree` is the call for a caller that writes none).
        Every process applies the answer of point k at point k + 1, the same iteration
        everywhere. A call between two points returns False and exchanges nothing.

        Args:
            due: This process proposes to write lines now.
            iteration: The current iteration (the same on every process); the agreement points
                are counted in it.

        Returns:
            Whether ``due`` was true on some process (several processes: at the previous
            agreement point, or at one before it whose answer nobody returned yet).

        Raises:
            FloatingPointError: as :meth:`flush`, for the numbers of the applied answer.
        """
        if self.gather is None:
            self.stop_agreed = self.stop_agreed or self.stop_requested
            if due:
                self.flush()
            return due
        self.agree(due, iteration=iteration)
        write, self._write_agreed = self._write_agreed, False
        return write

    def agree(self, due: bool = False, *, iteration: int) -> None:
        """:meth:`flush_if` for a caller that writes no lines (the preemption check): the agreed ``due`` waits for the next :meth:`flush_if`.

        On one process it only turns :attr:`stop_requested` into :attr:`stop_agreed`. Under
        several, a call before the next agreement point does nothing (``due`` is held for it).
        """
        if self.gather is None:
            self.stop_agreed = self.stop_agreed or self.stop_requested
            return
        if iteration < self._next_agree:  # between agreement points: nothing exchanged
            self._due = self._due or due
            return
        self._settle(True)  # the previous point's answer (sets the gap): may raise, before this point's collective starts
        batch = self._take(None)
        flat, batch.names = self._message(due or self._due, batch)
        self._due = False
        self._in_flight = (batch, self.gather(flat))  # started, not waited for
        self._next_agree = iteration + self._gap  # the same on every process: the gap comes from a gathered answer
        if batch.rows:
            self.synced_at = batch.rows[-1][0]

    def flush(self, raise_on_nonfinite: bool | None = None) -> None:
        """Turn every pending tensor into a number (one transfer per device) and timestamps into times.

        Call it at the same iteration on every process: under several processes it first
        waits for the answer of the last :meth:`flush_if` still in flight and applies it,
        then makes one blocking collective when anything is pending (the numbers are reduced
        over the processes, the non-finite check and a stop request are agreed).

        Args:
            raise_on_nonfinite: Override the store's setting for this call. Error paths pass
                False: no second exception hides the first, and nothing new is exchanged (the
                other processes may not be there): the answer in flight (started by every
                process at the same iteration) is still waited for, and its own numbers are
                kept if that fails; pending numbers stay this process's own.

        Raises:
            FloatingPointError: a loss was NaN/Inf on this or another process. On the process
                that saw it the message names the first such iteration and that iteration's
                loss dict. The numbers are in the buffers either way.
        """
        check = raise_on_nonfinite is not False
        self._settle(check)
        batch = self._take(raise_on_nonfinite)
        if not batch.rows:
            return
        everyone = None
        if check and self.gather is not None:
            flat, batch.names = self._message(False, batch)
            everyone = self.gather(flat)()
            self.synced_at = batch.rows[-1][0]
        self._apply(batch, everyone, check)
        if everyone is not None:  # this collective agreed on everything an agreement point does: the next point counts from here
            self._next_agree = batch.rows[-1][0] + self._gap

    def _settle(self, check: bool) -> None:
        """Wait for the collective in flight (if any) and apply its answer; ``check=False``: an error path, never raise."""
        if self._in_flight is None:
            return
        batch, wait = self._in_flight
        self._in_flight = None
        if check:
            self._apply(batch, wait(), True)
            return
        try:
            self._apply(batch, wait(), False)
        except Exception:  # noqa: BLE001 - an error path (the wait failed, or the answers disagree): this process's own numbers
            self._apply(batch, None, False)

    def _take(self, raise_on_nonfinite: bool | None) -> FlushBatch:
        """The pending rows converted to numbers (one device→host transfer per device), with their times and the first non-finite loss."""
        rows = self._pending.copy()
        self._pending.clear()  # in place: the train loop's recorder appends to this list
        starts, self._clock_starts = self._clock_starts, {}
        iters, data, total, self._prev_end = derive_times(rows, starts, self._prev_end, self._untimed_to)
        batch = FlushBatch(rows, iters, data, total)
        batch.convert(self.raise_on_nonfinite if raise_on_nonfinite is None else raise_on_nonfinite)
        return batch

    def _message(self, due: bool, batch: FlushBatch) -> tuple[torch.Tensor, str]:
        """What one collective carries (:meth:`FlushBatch.message`), with this process's proposed gap to the next agreement point."""
        if batch.total:  # this process's pace, from the rows it carries (the last measured one otherwise)
            self._pace = sum(batch.total) / len(batch.total)
        proposal = 0  # unknown pace or agree_secs=0: agree at every call
        if self._pace and self.agree_secs > 0:  # the iterations that fill agree_secs (rounded up: the logger's flush_secs has passed by then)
            proposal = min(max(math.ceil(self.agree_secs / self._pace), 1), self.flush_every)
        return batch.message(due, self.stop_requested, proposal)

    def _apply(self, batch: FlushBatch, everyone: torch.Tensor | None, check: bool) -> None:
        """Reduce the batch by the answer (when there is one), extend the buffers, take the decisions, raise."""
        any_bad = batch.bad is not None
        if everyone is not None:
            any_bad = self._reduce(batch, everyone)
        for name, (iters, vals) in batch.columns.items():
            self.buffer(name).extend(vals, iters)
        if batch.iters:
            self.buffer("data_time").extend(batch.data, batch.iters)
            self.buffer("time").extend(batch.total, batch.iters)
        if check and any_bad:
            self._raise_nonfinite(batch.rows, batch.bad, batch.local)

    def _reduce(self, batch: FlushBatch, everyone: torch.Tensor) -> bool:
        """Apply an answer ``[world, n]``: flags OR-ed, numbers reduced in place (``data_time`` max, the rest mean); whether a loss was non-finite somewhere."""
        flags, self._gap = batch.agreed(everyone)  # the gap is the same on every process: the slowest pace (0: some process has none yet)
        self._write_agreed = self._write_agreed or flags[0] > 0
        self.stop_agreed = self.stop_agreed or flags[1] > 0
        batch.reduce(everyone)
        return bool(flags[2] > 0)

    def _raise_nonfinite(self, rows: list[Row], bad: tuple[int, str] | None, local: dict[str, tuple[list[int], list[float]]]) -> None:
        fixes = (
            "Lower the learning rate, enable gradient clipping (optim_wrapper=dict(clip_grad=dict(max_norm=1.0))), "
            "check the data for NaN/Inf, or pass nonfinite_loss='skip' to the Trainer to skip such steps."
        )
        if bad is None:
            span = f"in iterations {rows[0][0]}..{rows[-1][0]}" if rows else f"(checked after iteration {self.synced_at})"
            raise FloatingPointError(
                f"Loss became infinite or NaN on another process {span}; that process's error names the iteration and its losses. {fixes}"
            )
        it = bad[0]
        losses = {name: v for name, (iters, vals) in local.items() for i, v in zip(iters, vals) if i == it}
        raise FloatingPointError(f"Loss became infinite or NaN at iteration {it}: {losses}. {fixes}")

    # -- reading ----------------------------------------------------------------------------
    def get(self, name: str) -> HistoryBuffer:
        """The buffer of ``name`` (flush first if you need the latest tensors counted)."""
        return self._buffers[name]

    def __contains__(self, name: str) -> bool:
        return name in self._buffers

    def names(self) -> list[str]:
        """All names with at least one number."""
        return list(self._buffers)

    def latest(self) -> dict[str, float]:
        """The latest number of every scalar (flushing pending tensors first)."""
        self.flush()
        return {k: b.latest for k, b in self._buffers.items()}

    def state_dict(self) -> dict[str, Any]:
        """Every buffer, as flushed so far (flush first): what a resumed run's first log lines average over."""
        return {k: b.state_dict() for k, b in self._buffers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the buffers saved by :meth:`state_dict`."""
        self._pending.clear()
        self._in_flight = None
        self._gap = self._next_agree = 0  # every process loads the same checkpoint: agree at the next call, as at a start
        self._prev_end = None
        self._clock_starts = {}
        self._buffers = {}
        for k, s in state.items():
            b = HistoryBuffer(self.window_size, self._history)
            b.load_state_dict(s)
            b.keep(self._history)
            self._buffers[k] = b
