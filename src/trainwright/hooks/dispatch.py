"""Hook dispatch: per event, the list of bound methods of hooks that override it.

Computed once when the hook list changes; a hook that overrides nothing is never called.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from trainwright.hooks.hook import EVENTS, Hook, get_priority, require_hook


class HookList:
    """An ordered collection of hooks with a precomputed per-event call list.

    Hooks are sorted by priority (stable: equal priorities keep insertion order).
    ``calls[event]`` is a tuple of bound methods; the loops iterate it directly.
    """

    def __init__(self, hooks: Iterable[Hook] = ()) -> None:
        self._hooks: list[Hook] = []
        self._idle: dict[int, frozenset[str]] = {}
        self._intervals: dict[int, int] = {}
        self.calls: dict[str, tuple[Callable[..., Any], ...]] = {}
        #: The gcd of the ``after_train_iter`` intervals hooks declared (1: none did). At its
        #: multiples and at an epoch's last batch the loop calls ``calls["after_train_iter"]``
        #: (every active hook, in priority order); at other iterations :attr:`after_iter_always`.
        self.after_iter_every = 1
        #: The ``after_train_iter`` calls of hooks that declare no interval (see :meth:`Hook.train_iter_interval`).
        self.after_iter_always: tuple[Callable[..., Any], ...] = ()
        for h in hooks:
            self.add(h)
        self._rebuild()

    @property
    def hooks(self) -> list[Hook]:
        """The hooks, in call order."""
        return list(self._hooks)

    def add(self, hook: Hook) -> None:
        """Insert ``hook`` after every hook of lower or equal priority number."""
        require_hook(hook)
        p = get_priority(hook.priority)
        idx = len(self._hooks)
        for i, h in enumerate(self._hooks):
            if get_priority(h.priority) > p:
                idx = i
                break
        self._hooks.insert(idx, hook)
        self._rebuild()

    def _rebuild(self) -> None:
        keys = [h.state_key for h in self._hooks if _has_state(h)]
        dup = {k for k in keys if keys.count(k) > 1}
        if dup:
            raise ValueError(f"Two stateful hooks share the state_key {sorted(dup)}; give each copy a distinct `state_key`")
        idle = self._idle
        active = {
            ev: [h for h in self._hooks if getattr(type(h), ev) is not getattr(Hook, ev) and ev not in idle.get(id(h), ())] for ev in EVENTS
        }
        self.calls = {ev: tuple(getattr(h, ev) for h in hooks) for ev, hooks in active.items()}
        intervals = [self._intervals.get(id(h), 1) for h in active["after_train_iter"]]
        gated = [n for n in intervals if n > 1]
        self.after_iter_every = math.gcd(*gated) if gated else 1
        self.after_iter_always = tuple(h.after_train_iter for h, n in zip(active["after_train_iter"], intervals) if n == 1)

    def refresh(self, trainer: Any) -> None:
        """Ask every hook for its :meth:`~Hook.idle_events` and :meth:`~Hook.train_iter_interval`; rebuild the per-iteration lists.

        The train loop calls this after ``before_train`` and with ``None`` after ``after_train``
        (which makes every hook active again, every iteration).
        """
        self._idle = {}
        self._intervals = {}
        if trainer is not None:
            for h in self._hooks:
                skip = frozenset(h.idle_events(trainer)) & _ITER_EVENTS
                if skip:
                    self._idle[id(h)] = skip
                n = h.train_iter_interval(trainer)
                if not isinstance(n, int) or n < 1:
                    raise ValueError(f"{type(h).__name__}.train_iter_interval() must return an int >= 1, got {n!r}")
                if n > 1:
                    self._intervals[id(h)] = n
        self._rebuild()

    def call(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call ``event`` on every hook that overrides it (not used on the per-iteration path)."""
        for fn in self.calls[event]:
            fn(*args, **kwargs)

    def get(self, cls_or_name: type | str) -> Hook | None:
        """Return the first hook of that class (or class name / state_key), or None."""
        for h in self._hooks:
            if (isinstance(cls_or_name, str) and cls_or_name in (type(h).__name__, h.state_key)) or (isinstance(cls_or_name, type) and isinstance(h, cls_or_name)):
                return h
        return None

    def stateful(self) -> list[Hook]:
        """Hooks that define their own state_dict."""
        return [h for h in self._hooks if _has_state(h)]

    def __iter__(self):  # noqa: D105
        return iter(self._hooks)

    def __len__(self) -> int:  # noqa: D105
        return len(self._hooks)


_ITER_EVENTS = frozenset({"before_train_iter", "after_train_iter"})


def _has_state(hook: Hook) -> bool:
    return callable(getattr(hook, "state_dict", None)) and callable(getattr(hook, "load_state_dict", None))
