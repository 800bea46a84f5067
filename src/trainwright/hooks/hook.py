"""The hook base class: every event of a run, each a no-op until overridden."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from trainwright.checkpoint.manager import SaveRecord
    from trainwright.checkpoint.storage import Location, Store
    from trainwright.hooks.view import TrainerView

#: Every event a hook can handle, in the order a run meets them.
EVENTS: tuple[str, ...] = (
    "before_run",
    "before_train",
    "before_train_epoch",
    "before_train_iter",
    "after_train_iter",
    "after_train_epoch",
    "before_val",
    "before_val_epoch",
    "before_val_iter",
    "after_val_iter",
    "after_val_epoch",
    "after_val",
    "after_train",
    "before_test",
    "before_test_epoch",
    "before_test_iter",
    "after_test_iter",
    "after_test_epoch",
    "after_test",
    "before_save_checkpoint",
    "after_save_checkpoint",
    "after_load_checkpoint",
    "after_run",
)

#: Named priorities (lower runs first), as in mmengine.
PRIORITIES: dict[str, int] = {
    "HIGHEST": 0,
    "VERY_HIGH": 10,
    "HIGH": 30,
    "ABOVE_NORMAL": 40,
    "NORMAL": 50,
    "BELOW_NORMAL": 60,
    "LOW": 70,
    "VERY_LOW": 90,
    "LOWEST": 100,
}


#: detectron2's ``HookBase`` events and what a trainwright hook writes instead.
DETECTRON2_EVENTS: dict[str, str] = {
    "before_step": "before_train_iter(self, trainer, batch_idx, data_batch)",
    "after_step": "after_train_iter(self, trainer, batch_idx, data_batch, outputs)",
    "after_backward": "optimizer.register_step_pre_hook(fn) in before_train "
    "(it runs with the final, clipped gradients)",
}

_checked: set[type] = set()


def require_hook(obj: Any) -> Hook:
    """``obj`` if it is a :class:`Hook`, else a TypeError that says how to make one; warns (once per class) about
    methods named like an event it is not."""
    if not isinstance(obj, Hook):
        raise TypeError(
            f"Hooks must subclass trainwright.Hook, got {type(obj).__name__}; build dicts with "
            "trainwright.registry.HOOKS"
        )
    cls = type(obj)
    if cls not in _checked:
        _checked.add(cls)
        _warn_missed_events(cls)
    return obj


def _warn_missed_events(cls: type) -> None:
    """A method trainwright never calls although its name says it is an event: detectron2's, or a near-miss of one of
    :data:`EVENTS`."""
    from trainwright.registry import TYPO_CUTOFF

    own = {
        name
        for klass in cls.__mro__
        if klass not in (Hook, object)
        for name, value in vars(klass).items()
        if callable(value) and not name.startswith("_")
    }
    missed = {}
    for name in sorted(own - set(EVENTS)):
        if name in DETECTRON2_EVENTS:
            missed[name] = f"detectron2's HookBase event; trainwright never calls it: write {DETECTRON2_EVENTS[name]}"
        else:
            close = difflib.get_close_matches(name, EVENTS, n=1, cutoff=TYPO_CUTOFF)
            if close and close[0] not in own:
                missed[name] = f"not an event, so never called; did you mean {close[0]!r}?"
    if missed:
        lines = "; ".join(f"{cls.__name__}.{name}: {why}" for name, why in missed.items())
        as_is = (
            ". A detectron2 hook runs as it is under trainwright.engine.SimpleTrainer, subclassing "
            "trainwright.engine.HookBase"
            if missed.keys() & DETECTRON2_EVENTS.keys()
            else ""
        )
        warnings.warn(
            f"{lines} (docs/hooks.md lists the events, docs/parity.md maps detectron2's){as_is}",
            UserWarning,
            stacklevel=4,
        )


def get_priority(priority: int | str) -> int:
    """Turn a priority name (``"NORMAL"``) or number into a number; lower runs first."""
    if isinstance(priority, int):
        if not 0 <= priority <= 100:
            raise ValueError(f"Hook priority must be within 0..100, got {priority}")
        return priority
    if isinstance(priority, str) and priority.upper() in PRIORITIES:
        return PRIORITIES[priority.upper()]
    raise ValueError(f"Unknown hook priority {priority!r}; use an int in 0..100 or one of {list(PRIORITIES)}")


class EveryInEpoch:
    """An interval counted within each epoch: the ``n``-th, ``2n``-th... iteration of every epoch of ``epoch_len``
    iterations.

    What :meth:`Hook.train_iter_interval` returns for mmengine's ``every_n_inner_iters`` (its
    LoggerHook counts its interval within the epoch): with 45 iterations per epoch and
    ``n=10``, epoch 2's lines are at its 10th, 20th, 30th and 40th iteration (run-wide 55, 65,
    75, 85), plus its end.
    """

    __slots__ = ("n", "epoch_len")

    def __init__(self, n: int, epoch_len: int) -> None:
        if n < 1 or epoch_len < 1:
            raise ValueError(f"EveryInEpoch needs n >= 1 and epoch_len >= 1, got n={n}, epoch_len={epoch_len}")
        self.n, self.epoch_len = n, epoch_len

    def __contains__(self, iteration: int) -> bool:
        return ((iteration - 1) % self.epoch_len + 1) % self.n == 0

    def next_after(self, iteration: int) -> int:
        """The first such run-wide iteration (1-based) after ``iteration``."""
        start = iteration - iteration % self.epoch_len  # the iterations before this epoch's first
        nxt = (iteration - start) // self.n * self.n + self.n
        return start + nxt if nxt <= self.epoch_len else start + self.epoch_len + self.n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EveryInEpoch) and (self.n, self.epoch_len) == (other.n, other.epoch_len)

    def __hash__(self) -> int:
        return hash((self.n, self.epoch_len))

    def __repr__(self) -> str:
        return f"EveryInEpoch({self.n}, {self.epoch_len})"


class Hook:
    """Base class for hooks: override the events you need, nothing else costs anything.

    The trainer is passed to every event (hooks keep no reference to it). Iteration events
    also get ``batch_idx`` (position inside the epoch), ``data_batch`` and, after the
    iteration, ``outputs`` (train: the dict of log tensors; val/test: the predictions).

    A hook that holds state implements ``state_dict`` / ``load_state_dict``; it is saved in
    the checkpoint under :attr:`state_key` (class name by default) so two copies of one hook
    must be given distinct keys.

    Attributes:
        priority: Lower runs first; ``"NORMAL"`` (50) by default.
        checkpoint_settings: Checkpoint storage settings this hook was given (``out_dir``, ``max_keep_ckpts``...;
            the keys of ``Trainer(checkpoint=dict(...))``): the Trainer gives them to its checkpoint manager when it
            builds it (mmengine configs name them under ``default_hooks.checkpoint``). Empty for most hooks.
    """

    priority: ClassVar[int | str] = "NORMAL"
    checkpoint_settings: Mapping[str, Any] = MappingProxyType({})

    @property
    def state_key(self) -> str:
        """Name under which this hook's state lives in a checkpoint."""
        return getattr(self, "_state_key", None) or type(self).__name__

    @state_key.setter
    def state_key(self, value: str) -> None:
        self._state_key = value

    def saves_periodic_checkpoints(self) -> bool | None:
        """Whether this hook is the checkpoint policy and saves periodically (a spike-guard rollback goes back to those
        saves).

        None (here): it writes no checkpoints; the checkpoint hook answers True, or False when its interval is <= 0.
        """
        return None

    def checkpoint_record(self) -> SaveRecord | None:
        """The record of saved checkpoints this hook keeps as its state (the checkpoint hook's): the Trainer gives it
        to its checkpoint manager when it builds it (or registers this hook), so every save is recorded there.

        None (here): this hook keeps no such record.
        """
        return None

    def stores(self) -> tuple[Store, ...]:
        """The remote stores this hook writes to (the logger hook's ``out_dir``): the Trainer checks each (bucket,
        credentials, endpoint) before it creates anything. Empty (here) for most hooks."""
        return ()

    def before_run(self, trainer: TrainerView) -> None:
        """Once, before anything (train, val or test) runs."""

    def after_run(self, trainer: TrainerView) -> None:
        """Once, after everything ran (also on an error or preemption)."""

    def before_train(self, trainer: TrainerView) -> None:
        """Before the training loop starts (after a resume has been loaded)."""

    def after_train(self, trainer: TrainerView) -> None:
        """After the training loop ends."""

    def before_train_epoch(self, trainer: TrainerView) -> None:
        """Before each training epoch (iteration-based runs: once, before the first iteration)."""

    def after_train_epoch(self, trainer: TrainerView) -> None:
        """After each training epoch (``trainer.progress.epoch`` already counts it; iteration-based runs: once, at
        the end)."""

    def before_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None) -> None:
        """Before each training iteration; the batch has already been fetched."""

    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        """After each training iteration (``trainer.progress.iteration`` already counts it)."""

    def before_val(self, trainer: TrainerView) -> None:
        """Before a validation run."""

    def after_val(self, trainer: TrainerView) -> None:
        """After a validation run."""

    def before_val_epoch(self, trainer: TrainerView) -> None:
        """Before the pass over the validation data."""

    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:
        """After the pass over the validation data, with the computed metrics (None when a stop request cut the pass
        short)."""

    def before_val_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None) -> None:
        """Before each validation iteration."""

    def after_val_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        """After each validation iteration."""

    def before_test(self, trainer: TrainerView) -> None:
        """Before a test run."""

    def after_test(self, trainer: TrainerView) -> None:
        """After a test run."""

    def before_test_epoch(self, trainer: TrainerView) -> None:
        """Before the pass over the test data."""

    def after_test_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:
        """After the pass over the test data, with the computed metrics."""

    def before_test_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None) -> None:
        """Before each test iteration."""

    def after_test_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        """After each test iteration."""

    def before_save_checkpoint(self, trainer: TrainerView, checkpoint: dict) -> None:
        """May add to or edit the checkpoint dict before it is written."""

    def after_save_checkpoint(self, trainer: TrainerView, path: Location) -> None:
        """Called after each periodic or best checkpoint is written (with ``async_save``: handed to the background
        writer).

        ``path`` is where it goes: a local ``Path``, or a :class:`~trainwright.checkpoint.storage.RemotePath` of its
        store.
        The logger hook copies the run's logs here.
        """

    def after_load_checkpoint(self, trainer: TrainerView, checkpoint: dict) -> None:
        """Called after a checkpoint has been loaded for resume."""

    def train_iter_interval(self, trainer: TrainerView) -> int | range | EveryInEpoch:
        """Every how many iterations this hook's per-iteration training events have work, in this ``train()``.

        The one way to gate a hook by iterations. Asked once, right after ``before_train``:

        * ``1`` (default): ``before_train_iter`` / ``after_train_iter`` run at every iteration;
        * ``n > 1``: they run only around the iterations whose run-wide number is a multiple
          of ``n``, around each epoch's last iteration and around the run's last iteration
          (an interval's short tail);
        * ``0``: never in this run (the hook has nothing to do per iteration);
        * a ``range`` of run-wide iteration numbers (1-based): around exactly those, e.g.
          ``range(101, 111)`` for a window of ten (epoch ends outside it do not count);
        * :class:`EveryInEpoch` ``(n, epoch_len)``: every ``n``-th iteration counted within
          each epoch, each epoch's last iteration and the run's last (mmengine's logger).

        Hooks due at the same iteration run in priority order. A hook called only when due
        costs nothing at the other iterations, which matters on small models.
        """
        return 1

    def every_n_iters(self, trainer: TrainerView, n: int) -> bool:
        """True when the iteration just finished is a multiple of ``n`` (run-wide count); mmcv's / early mmengine's
        helper, for ported hooks."""
        return n > 0 and trainer.progress.iteration % n == 0

    def every_n_epochs(self, trainer: TrainerView, n: int) -> bool:
        """True when the epoch just finished is a multiple of ``n``; mmengine's helper, for ported hooks."""
        return n > 0 and trainer.progress.epoch % n == 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(priority={self.priority})"
