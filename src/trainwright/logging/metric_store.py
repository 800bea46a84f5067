"""MetricStore: the one owner of logged numbers; tensors stay tensors until a flush.

The train loop hands it each iteration's outputs and two timestamps as one row, with no
host-device sync; a flush turns the pending tensors into numbers in one batch and hands them to
the :class:`~trainwright.logging.agreement.Agreement`, so a non-finite loss raises on every
process at the same flush.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from trainwright.logging.agreement import Agreement, NonFinite
from trainwright.logging.flush_batch import FlushBatch, Row, derive_times
from trainwright.logging.history_buffer import HistoryBuffer
from trainwright.logging.nonfinite_error import NonFiniteLossError

__all__ = ["HistoryBuffer", "MetricStore", "Row"]


#: The outputs of an iteration that gather_metric_period leaves out: its times are still recorded.
_NO_OUTPUTS: Mapping[str, Any] = MappingProxyType({})


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
    asked: at agreement points and logging iterations, epoch ends and the end of training (the
    loops), before evaluation results are logged and before a checkpoint. Each of these points
    is the same iteration on every process.

    Args:
        window_size: Values ``median`` / ``mean`` of each buffer look at by default.
        flush_every: Convert pending tensors after this many recorded iterations at the
            latest, so memory stays bounded whoever asks for numbers.
        raise_on_nonfinite: On flush, raise :class:`FloatingPointError` when a value whose
            name contains ``"loss"`` is NaN or infinite (on any process).
        agreement: Decides with the other processes at each flush (the trainer's; default: a
            one-process :class:`~trainwright.logging.agreement.Agreement`). Every process must
            log the same names at the same iterations.
    """

    def __init__(
        self,
        window_size: int = 20,
        flush_every: int = 1000,
        raise_on_nonfinite: bool = True,
        agreement: Agreement | None = None,
    ) -> None:
        self.window_size = window_size
        self.flush_every = flush_every
        self.raise_on_nonfinite = raise_on_nonfinite
        self.agreement = agreement if agreement is not None else Agreement()
        self._history = 0
        self._buffers: dict[str, HistoryBuffer] = {}
        self._pending: list[Row] = []
        self._prev_end: float | None = None  # end of the last timed iteration; None: not timing
        self._clock_starts: dict[int, float] = {}  # pending index → when the clock (re)started before it
        self._untimed_to = 0  # iterations up to this one get no data_time / time (the timer's warm-up)
        #: Whether gradient clipping is on (the trainer sets it; read when a NaN is raised, whose advice depends on it).
        self.clipping: Callable[[], bool] = lambda: False
        #: Where the non-finite loss of an iteration came from, as text for the error; called only when the error is
        #: raised. None (the Trainer's store): the :class:`NonFiniteLossError` goes out unexplained, and the run's guard
        #: explains it (:func:`trainwright.diagnose.explain_nonfinite`).
        self.explain: Callable[[int], str] | None = None

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
        iterations (the train loop does, on the hooks' schedule). With ``period > 1`` the
        outputs of iterations whose number is a multiple of ``period`` are recorded
        (detectron2's ``SimpleTrainer(gather_metric_period=...)``); the others keep no
        reference to their outputs but, as detectron2's timer, still record their
        ``data_time`` / ``time``.

        Raises:
            ValueError: ``period`` is not an int >= 1.
        """
        if not isinstance(period, int) or period < 1:
            raise ValueError(
                f"gather_metric_period must be an int >= 1 (record step outputs every N iterations), got {period!r}"
            )
        pending = self._pending  # the one list of this store: a flush empties it in place
        if period == 1:
            return pending.append

        def record_every(row: Row) -> None:
            pending.append(row if row[0] % period == 0 else (row[0], _NO_OUTPUTS, row[2], row[3]))

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

    # -- flushing -------------------------------------------------------------------------
    def flush(self, raise_on_nonfinite: bool | None = None, *, agree: bool = False) -> None:
        """Turn every pending tensor into a number (one transfer per device) and timestamps into times.

        Call it at the same iteration on every process: the batch goes through the agreement
        (under several processes one collective, made only when rows are pending or ``agree``).

        Args:
            raise_on_nonfinite: Override the store's setting for this call. Error paths pass
                False: nothing is exchanged (the other processes may not be there), no second
                exception hides the first, and the numbers stay this process's own.
            agree: An agreement point: exchange even when nothing is pending, so that a stop
                proposal travels.

        Raises:
            NonFiniteLossError: (a FloatingPointError) a loss was NaN/Inf on this or another
                process; the message names the first such iteration (and, on a process that saw
                it, its losses). The numbers are in the buffers either way.
        """
        check = self.raise_on_nonfinite if raise_on_nonfinite is None else raise_on_nonfinite
        rows = self._pending.copy()
        if not rows and not agree:
            return
        self._pending.clear()  # in place: the train loop's recorder appends to this list
        starts, self._clock_starts = self._clock_starts, {}
        iters, data, total, self._prev_end = derive_times(rows, starts, self._prev_end, self._untimed_to)
        batch = FlushBatch(rows, iters, data, total)
        batch.convert(check)
        bad = self.agreement.exchange(batch) if raise_on_nonfinite is not False else None
        for name, (its, vals) in batch.columns.items():
            self.buffer(name).extend(vals, its)
        if batch.iters:
            self.buffer("data_time").extend(batch.data, batch.iters)
            self.buffer("time").extend(batch.total, batch.iters)
        if check and bad is not None:
            self._raise_nonfinite(bad, batch)

    def _raise_nonfinite(self, bad: NonFinite, batch: FlushBatch) -> None:
        if self.clipping():  # clipping bounds the update, not the loss: advise what it does not cover
            fixes = (
                "Gradient clipping is on already (it bounds each update, not the loss): lower the learning rate, check "
                "the data and the loss "
                "for NaN/Inf (a log or division of 0, an overflow under 16-bit precision: try bf16-mixed or 32), "
                "or pass nonfinite_loss='skip' to the Trainer to skip such steps."
            )
        else:
            fixes = (
                "Lower the learning rate, enable gradient clipping (optim_wrapper=dict(clip_grad=dict(max_norm=1.0))), "
                "check the data for NaN/Inf, or pass nonfinite_loss='skip' to the Trainer to skip such steps."
            )
        it = bad.iteration
        # the first bad iteration and the rank(s) that saw it, the same on every process
        where = f"at iteration {it}" + (
            f" on rank{'s' * (len(bad.ranks) > 1)} {', '.join(map(str, bad.ranks))}" if bad.ranks else ""
        )
        if batch.bad is None or batch.bad[0] != it:
            head = f"Loss became infinite or NaN {where}; that process's error names its losses."
        else:
            losses = {name: v for name, (iters, vals) in batch.local.items() for i, v in zip(iters, vals) if i == it}
            head = f"Loss became infinite or NaN {where}: {losses}."
        error = NonFiniteLossError(it, bad.ranks, head, fixes)
        if self.explain is not None:
            error.explanation = self.explain(it)  # every process (the same path): each replays its own batch
        raise error

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
        self._prev_end = None
        self._clock_starts = {}
        self._buffers = {}
        for k, s in state.items():
            b = HistoryBuffer(self.window_size, self._history)
            b.load_state_dict(s)
            b.keep(self._history)
            self._buffers[k] = b
