"""EventStorage: detectron2's per-run store of scalars, kept in trainwright's :class:`~trainwright.logging.MetricStore`.

detectron2 code writes ``storage.put_scalar("lr", lr)`` in hooks and models and reads
``storage.history("total_loss").median(20)`` in writers. Here those calls land in one
:class:`~trainwright.logging.MetricStore` (the owner of logged numbers everywhere in
trainwright), so there is one buffer type and one set of statistics; this module only adds
detectron2's spellings and its ``(value, iteration)`` pairs.
"""

from __future__ import annotations

from typing import Any, ClassVar

from trainwright.logging import HistoryBuffer, MetricStore

__all__ = ["EventStorage", "History", "get_event_storage"]


class History:
    """detectron2's ``HistoryBuffer`` methods over one of the metric store's buffers.

    detectron2 calls ``latest()`` and ``global_avg()`` as methods and ``avg(window)`` what
    trainwright's :class:`~trainwright.logging.HistoryBuffer` calls ``mean``; this view gives
    those names and reads the same numbers.
    """

    __slots__ = ("buffer",)

    def __init__(self, buffer: HistoryBuffer) -> None:
        self.buffer = buffer

    def latest(self) -> float:
        """The most recent value."""
        return self.buffer.latest

    def median(self, window_size: int) -> float:
        """The median of the last ``window_size`` values."""
        return self.buffer.median(window_size)

    def avg(self, window_size: int) -> float:
        """The mean of the last ``window_size`` values."""
        return self.buffer.mean(window_size)

    def global_avg(self) -> float:
        """The mean of every value ever put."""
        return self.buffer.global_avg

    def values(self) -> list[tuple[float, int]]:
        """Every kept ``(value, iteration)``, oldest first (detectron2's order inside each pair)."""
        iters, vals = self.buffer.history()
        return list(zip(vals, iters))


class EventStorage:
    """The scalars of one ``train()`` call, by name, each with the iteration it belongs to.

    :meth:`TrainerBase.train <trainwright.engine.TrainerBase.train>` opens one (``with
    EventStorage(start_iter) as storage``) and keeps ``storage.iter`` equal to the trainer's
    iteration during each step, so a value put without ``cur_iter`` belongs to the step being
    run. Inside that block :func:`get_event_storage` returns it, as in detectron2, so a model
    can put its own scalars.

    Args:
        start_iter: The iteration of the first step (detectron2's 0-based counting).
        window_size: How many recent values the smoothed statistics read by default.
        history: How many values each scalar keeps with their iterations (detectron2 keeps
            up to a million); the global average counts every value either way.
    """

    _stack: ClassVar[list[EventStorage]] = []

    def __init__(self, start_iter: int = 0, *, window_size: int = 20, history: int = 1_000_000) -> None:
        self.iter = start_iter
        self.metric_store = MetricStore(window_size=window_size, raise_on_nonfinite=False)
        self.metric_store.keep_history(history)
        self._smoothing_hints: dict[str, bool] = {}

    # -- writing ------------------------------------------------------------------------------
    def put_scalar(self, name: str, value: Any, smoothing_hint: bool = True, cur_iter: int | None = None) -> None:
        """Add a number (a float or a one-element tensor) to the scalar ``name``.

        Args:
            name: The scalar's name, e.g. ``"lr"``.
            value: The number; a tensor is read with ``float()`` (one host sync).
            smoothing_hint: Whether writers should show a median over a window (True) or the
                latest value (False, e.g. the learning rate); the first put of a name decides.
            cur_iter: The iteration it belongs to (default: :attr:`iter`).

        Raises:
            ValueError: ``smoothing_hint`` differs from the first put of ``name``.
        """
        hint = self._smoothing_hints.setdefault(name, smoothing_hint)
        if hint != smoothing_hint:
            raise ValueError(
                f"Scalar {name!r} was put with smoothing_hint={hint} first and now with {smoothing_hint}; put it with "
                "one hint throughout"
            )
        self.metric_store.update_scalar(name, float(value), self.iter if cur_iter is None else cur_iter)

    def put_scalars(self, *, smoothing_hint: bool = True, cur_iter: int | None = None, **kwargs: Any) -> None:
        """:meth:`put_scalar` for each keyword, e.g. ``put_scalars(loss_cls=0.3, loss_box=0.1)``."""
        for name, value in kwargs.items():
            self.put_scalar(name, value, smoothing_hint=smoothing_hint, cur_iter=cur_iter)

    def put_image(self, img_name: str, img_tensor: Any) -> None:
        """Not provided: trainwright's writers log scalars only."""
        raise NotImplementedError(
            f"EventStorage.put_image({img_name!r}) is not provided by trainwright.engine: its writers log scalars. "
            "Write images with a TensorBoard SummaryWriter of your own (torch.utils.tensorboard)"
        )

    def put_histogram(self, hist_name: str, hist_tensor: Any, bins: int = 1000) -> None:
        """Not provided: trainwright's writers log scalars only."""
        raise NotImplementedError(
            f"EventStorage.put_histogram({hist_name!r}) is not provided by trainwright.engine: its writers log "
            "scalars. "
            "Write histograms with a TensorBoard SummaryWriter of your own (torch.utils.tensorboard)"
        )

    def step(self) -> None:
        """Advance :attr:`iter` by one (for loops that use a storage without a trainer)."""
        self.iter += 1

    # -- reading ------------------------------------------------------------------------------
    def history(self, name: str) -> History:
        """The values of ``name``.

        Raises:
            KeyError: nothing was put under ``name``; the message lists the names there are.
        """
        if name not in self.metric_store:
            raise KeyError(
                f"No history metric available for {name!r}; the storage has {sorted(self.metric_store.names())}"
            )
        return History(self.metric_store.get(name))

    def histories(self) -> dict[str, History]:
        """Every scalar's values, by name."""
        return {name: History(self.metric_store.get(name)) for name in self.metric_store.names()}

    def latest(self) -> dict[str, tuple[float, int]]:
        """Every scalar's latest ``(value, iteration)``."""
        store = self.metric_store
        return {name: (store.get(name).latest, store.get(name).latest_iter) for name in store.names()}

    def latest_with_smoothing_hint(self, window_size: int = 20) -> dict[str, tuple[float, int]]:
        """Every scalar's ``(median over window_size, iteration)``, or its latest value where its hint is False."""
        out = {}
        for name, (value, it) in self.latest().items():
            out[name] = (
                self.metric_store.get(name).median(window_size) if self._smoothing_hints.get(name, True) else value,
                it,
            )
        return out

    def smoothing_hints(self) -> dict[str, bool]:
        """Each scalar's smoothing hint, as put first."""
        return dict(self._smoothing_hints)

    # -- the current storage ----------------------------------------------------------------------
    def __enter__(self) -> EventStorage:
        EventStorage._stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if not EventStorage._stack or EventStorage._stack[-1] is not self:
            raise RuntimeError(
                "EventStorage blocks must be left in the reverse order they were entered (nest `with "
                "EventStorage(...)` blocks)"
            )
        EventStorage._stack.pop()


def get_event_storage() -> EventStorage:
    """The storage of the innermost open ``with EventStorage(...)`` block (the one ``train()`` opens).

    Raises:
        RuntimeError: no storage is open, naming how to open one.
    """
    if not EventStorage._stack:
        raise RuntimeError(
            "get_event_storage() was called outside training: no EventStorage is open. "
            "Call it while trainer.train(start_iter, max_iter) runs, or open one with `with EventStorage(start_iter) "
            "as storage:`"
        )
    return EventStorage._stack[-1]
