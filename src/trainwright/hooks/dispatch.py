"""Hook dispatch: per event, the bound methods of the hooks that override it.

Computed once when the hook list changes; a hook that overrides nothing is never called.
Per-iteration training events follow each hook's :meth:`~trainwright.Hook.train_iter_interval`
(asked once per ``train()``), through one :class:`IterSchedule`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any, TypedDict

from trainwright.checkpoint.stateful import Stateful
from trainwright.hooks.hook import EVENTS, EveryInEpoch, Hook, get_priority, require_hook
from trainwright.hooks.timing import HookReport, HookTimer

Call = Callable[..., Any]
Interval = int | range | EveryInEpoch  # see Hook.train_iter_interval


class IterSchedule:
    """Which ``before_train_iter`` / ``after_train_iter`` calls are due at an iteration.

    Each hook has an interval ``n`` (see :meth:`Hook.train_iter_interval`): ``1`` every
    iteration, ``n > 1`` at multiples of ``n``, at an epoch's last iteration and at the run's
    last iteration (``last_iter``), ``0`` never; a window, a ``range`` of iteration
    numbers: exactly at those; or :class:`~trainwright.hooks.hook.EveryInEpoch`: multiples
    counted within each epoch, epoch ends and the run's last iteration.
    The loop reads :attr:`before_every` / :attr:`after_every` (the interval-1 hooks) at most
    iterations and asks :meth:`due` only when :attr:`next_due` is reached or an epoch ends:
    one comparison per step, and hooks are called exactly when due, in priority order.

    Args:
        before: ``(bound before_train_iter, interval)`` in priority order.
        after: ``(bound after_train_iter, interval)`` in priority order.
        last_iter: The run's last iteration (``max_iters``); 0: unknown (a hand-driven loop).
    """

    def __init__(
        self, before: list[tuple[Call, Interval]], after: list[tuple[Call, Interval]], last_iter: int = 0
    ) -> None:
        self.last_iter = last_iter
        self._before = [(fn, n) for fn, n in before if n]  # 0 and empty windows: never
        self._after = [(fn, n) for fn, n in after if n]
        self.before_every: tuple[Call, ...] = tuple(fn for fn, n in self._before if n == 1)
        self.after_every: tuple[Call, ...] = tuple(fn for fn, n in self._after if n == 1)
        self._gated = sorted({n for _, n in self._before + self._after if isinstance(n, int) and n > 1})
        self._windows = list(dict.fromkeys(n for _, n in self._before + self._after if isinstance(n, range)))
        self._in_epoch = list(dict.fromkeys(n for _, n in self._before + self._after if isinstance(n, EveryInEpoch)))
        #: The next iteration (run-wide, 1-based) at which a gated hook is due; 0 until the
        #: first :meth:`due` call places it (so a run resumed at any iteration starts right).
        self.next_due: float = 0

    def due(self, iteration: int, epoch_end: bool) -> tuple[tuple[Call, ...], tuple[Call, ...]]:
        """``(before calls, after calls)`` for ``iteration`` (1-based); moves :attr:`next_due` past it."""
        self.next_due = self._next_after(iteration)
        epoch_end = epoch_end or iteration == self.last_iter  # the run's end is due like an epoch's

        def pick(hooks: list[tuple[Call, Interval]]) -> tuple[Call, ...]:
            return tuple(
                fn
                for fn, n in hooks
                if n == 1
                or (
                    iteration in n
                    if isinstance(n, range)
                    else epoch_end or (iteration in n if isinstance(n, EveryInEpoch) else iteration % n == 0)
                )
            )

        return pick(self._before), pick(self._after)

    def _next_after(self, iteration: int) -> float:
        nxt: float = min((iteration // n + 1) * n for n in self._gated) if self._gated else float("inf")
        for e in self._in_epoch:
            nxt = min(nxt, e.next_after(iteration))
        if (self._gated or self._in_epoch) and iteration < self.last_iter:
            nxt = min(nxt, self.last_iter)
        for w in self._windows:
            nxt = min(nxt, _next_in(w, iteration))
        return nxt


def _next_in(window: range, iteration: int) -> float:
    """The first number of ``window`` above ``iteration`` (inf when none is left)."""
    if not window or window[-1] <= iteration:
        return float("inf")
    if iteration < window.start:
        return window.start
    return window.start + ((iteration - window.start) // window.step + 1) * window.step


class CheckpointEvents(TypedDict):
    """The checkpoint manager's callbacks that dispatch the checkpoint events (see
    :meth:`HookList.checkpoint_events`)."""

    before_save: Callable[[Any], None]
    after_save: Callable[[Any], None]
    after_load: Callable[[Any], None]


class HookList:
    """An ordered collection of hooks with a precomputed per-event call list.

    Hooks are sorted by priority (stable: equal priorities keep insertion order).
    ``calls[event]`` is a tuple of bound methods; the loops iterate it directly. The
    per-iteration training events are dispatched through :attr:`schedule`.

    Args:
        hooks: The hooks.
        timer: Time every hook call (see :mod:`trainwright.hooks.timing`): the lists then hold
            timing wrappers of the bound methods, built here once. None: the plain methods.
    """

    def __init__(self, hooks: Iterable[Hook] = (), timer: HookTimer | None = None) -> None:
        self._hooks: list[Hook] = []
        self._intervals: dict[int, Interval] = {}
        self._periodic: tuple[tuple[Call, Interval], ...] = ()
        self._last_iter = 0
        self.timer = timer
        self.calls: dict[str, tuple[Call, ...]] = {}
        self.schedule = IterSchedule([], [])
        self._priorities: list[int] = []  # get_priority of each hook, in call order (bisected by add)
        for h in hooks:
            self._insert(h)
        self._rebuild()  # once for all of them

    @property
    def hooks(self) -> list[Hook]:
        """The hooks, in call order."""
        return list(self._hooks)

    def add(self, hook: Hook) -> None:
        """Insert ``hook`` after every hook of lower or equal priority number; the call lists are rebuilt once."""
        self._insert(hook)
        self._rebuild()

    def _insert(self, hook: Hook) -> None:
        """Place ``hook`` by priority (a bisection), refusing a second stateful hook with a ``state_key`` already
        held."""
        require_hook(hook)
        if isinstance(hook, Stateful) and any(h.state_key == hook.state_key for h in self.stateful()):
            raise ValueError(
                f"Two stateful hooks share the state_key {[hook.state_key]}; give each copy a distinct `state_key`"
            )
        p = get_priority(hook.priority)
        idx = bisect.bisect_right(self._priorities, p)
        self._hooks.insert(idx, hook)
        self._priorities.insert(idx, p)

    def _rebuild(self) -> None:
        active = {ev: [h for h in self._hooks if getattr(type(h), ev) is not getattr(Hook, ev)] for ev in EVENTS}
        timer = self.timer
        self.calls = {
            ev: tuple(getattr(h, ev) if timer is None else timer.wrap(h, ev, getattr(h, ev)) for h in hooks)
            for ev, hooks in active.items()
        }
        self.schedule = IterSchedule(
            [
                (fn, self._intervals.get(id(h), 1))
                for h, fn in zip(active["before_train_iter"], self.calls["before_train_iter"])
            ],
            [
                (fn, self._intervals.get(id(h), 1))
                for h, fn in zip(active["after_train_iter"], self.calls["after_train_iter"])
            ]
            + list(self._periodic),
            self._last_iter,
        )

    def refresh(self, trainer: Any, last_iter: int = 0, periodic: Iterable[tuple[Call, Interval]] = ()) -> None:
        """Ask every hook for its :meth:`~Hook.train_iter_interval`; rebuild the per-iteration schedule.

        The train loop calls this after ``before_train`` (with ``last_iter``, the run's last
        iteration: gated hooks are due there too) and with ``None`` after ``after_train``
        (every hook then gets every iteration event again, e.g. for a hand-driven loop).

        Args:
            periodic: ``(call, interval)`` of the run's own periodic work that follows the
                same schedule as the hooks' ``after_train_iter`` and runs after them (the
                loop's: the metric store's flush at every ``flush_every``-th iteration); called
                as ``call(trainer, batch_idx, data_batch, outputs)``. Dropped by ``refresh(None)``.
        """
        self._intervals = {}
        self._last_iter = last_iter if trainer is not None else 0
        self._periodic = tuple(periodic) if trainer is not None else ()
        if trainer is not None:
            for h in self._hooks:
                n = h.train_iter_interval(trainer)
                if isinstance(n, EveryInEpoch):
                    pass
                elif isinstance(n, range):
                    if n and (n.start < 1 or n.step < 1):
                        raise ValueError(
                            f"{type(h).__name__}.train_iter_interval() returned {n!r}: a window holds iteration "
                            "numbers >= 1 in increasing order, e.g. range(11, 16)"
                        )
                elif not isinstance(n, int) or isinstance(n, bool) or n < 0:
                    raise ValueError(
                        f"{type(h).__name__}.train_iter_interval() must return an int >= 0 (0: never, 1: every "
                        f"iteration) or a range of iterations, got {n!r}"
                    )
                if n != 1:
                    self._intervals[id(h)] = n
        self._rebuild()

    def call(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call ``event`` on every hook that overrides it (not used on the per-iteration path)."""
        for fn in self.calls[event]:
            fn(*args, **kwargs)

    def call_all(self, event: str, *args: Any, **kwargs: Any) -> list[tuple[Call, BaseException]]:
        """Call ``event`` on every hook that overrides it, even when some raise; return ``(method, error)`` of those
        that did.

        For cleanup events (``after_run``): one hook's failure must not skip the others'
        cleanup (a signal handler left installed, a file left open).
        """
        failed: list[tuple[Call, BaseException]] = []
        for fn in self.calls[event]:
            try:
                fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - collected and handed to the caller
                failed.append((fn, e))
        return failed

    def checkpoint_events(self, trainer: Any) -> CheckpointEvents:
        """The checkpoint manager's ``before_save`` / ``after_save`` / ``after_load`` callbacks: each calls its event on
        these hooks.

        ``before_save_checkpoint(trainer, checkpoint)``, ``after_save_checkpoint(trainer, path)`` and
        ``after_load_checkpoint(trainer, checkpoint)``, dispatched like every other event.
        """
        return {
            "before_save": partial(self.call, "before_save_checkpoint", trainer),
            "after_save": partial(self.call, "after_save_checkpoint", trainer),
            "after_load": partial(self.call, "after_load_checkpoint", trainer),
        }

    def get(self, cls_or_name: type | str) -> Hook | None:
        """Return the first hook of that class (or class name / state_key), or None."""
        for h in self._hooks:
            if (isinstance(cls_or_name, str) and cls_or_name in (type(h).__name__, h.state_key)) or (
                isinstance(cls_or_name, type) and isinstance(h, cls_or_name)
            ):
                return h
        return None

    def report(self) -> HookReport:
        """How long each hook spent in each event: rows ``(hook, event, calls, total_s)`` with ``mean_ms``.

        Counts every call since the list was built (training, validation, test), in hook order
        then event order; ``print(trainer.hooks.report())`` shows the table that is also logged
        when training ends. Times include hooks that a hook's event triggers.

        Raises:
            RuntimeError: the list was built without a timer (``Trainer(hook_timing=False)``).
        """
        if self.timer is None:
            raise RuntimeError(
                "hook_report() needs hook timing, which this trainer was built without: pass Trainer(hook_timing=True) "
                "(or leave it at its default, None)"
            )
        return self.timer.report(self)

    def stateful(self) -> list[Hook]:
        """Hooks that define their own ``state_dict`` / ``load_state_dict``."""
        return [h for h in self._hooks if isinstance(h, Stateful)]

    def __iter__(self) -> Iterator[Hook]:
        return iter(self._hooks)

    def __len__(self) -> int:
        return len(self._hooks)
