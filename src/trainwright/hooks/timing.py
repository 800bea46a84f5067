"""Per-hook timing: how long each hook spends in each event, measured on every call.

:class:`HookTimer` wraps the bound methods of a :class:`~trainwright.hooks.dispatch.HookList`'s
dispatch lists once, when the lists are built; the loops call the wrappers as they would the
methods. A hook that is not called (not overridden, or not due) is not timed. With timing off
(``Trainer(hook_timing=False)``) the lists hold the plain methods. Times are inclusive: a hook
whose event triggers other hooks (a checkpoint runs ``before_save_checkpoint``) counts theirs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from trainwright.hooks.hook import EVENTS, Hook

Call = Callable[..., Any]


class HookTime(NamedTuple):
    """One row of the hook report: a hook's time in one event."""

    hook: str
    event: str
    calls: int
    total_s: float

    @property
    def mean_ms(self) -> float:
        """Mean time per call, in milliseconds."""
        return self.total_s / self.calls * 1e3 if self.calls else 0.0


class HookReport(list[HookTime]):
    """The rows of :meth:`HookTimer.report` (hook order, then event order); ``str()`` is the table."""

    def table(self) -> str:
        """A plain-text table: hook, event, calls, total s, mean ms."""
        head = ("hook", "event", "calls", "total s", "mean ms")
        rows = [(r.hook, r.event, str(r.calls), f"{r.total_s:.4f}", f"{r.mean_ms:.4f}") for r in self]
        widths = [max(len(x) for x in col) for col in zip(head, *rows)]

        def line(cells: Iterable[str]) -> str:
            return "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
            ).rstrip()

        return "\n".join([line(head), *(line(r) for r in rows)])

    def __str__(self) -> str:
        return self.table() if self else "(no hook was called)"


class HookTimer:
    """Counts calls and accumulates time per (hook, event); survives rebuilds of the dispatch lists."""

    def __init__(self) -> None:
        self._stats: dict[tuple[int, str], list[float]] = {}  # (id(hook), event) -> [calls, seconds]

    def wrap(self, hook: Hook, event: str, fn: Call) -> Call:
        """``fn`` (``hook``'s bound ``event`` method) with its calls counted and timed."""
        stat = self._stats.setdefault((id(hook), event), [0, 0.0])
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                stat[1] += clock() - t
                stat[0] += 1

        # Look like the bound method to code that names it (error messages, tests reading __self__).
        timed.__qualname__ = getattr(fn, "__qualname__", event)
        timed.__name__ = event
        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        timed.__self__ = hook  # type: ignore[attr-defined]
        return timed

    def report(self, hooks: Iterable[Hook]) -> HookReport:
        """The called (hook, event) pairs of ``hooks``, in call order then event order."""
        hooks = list(hooks)
        names = [type(h).__name__ for h in hooks]
        out = HookReport()
        for h, name in zip(hooks, names):
            if names.count(name) > 1:  # two copies of one hook: tell them apart
                name = h.state_key if h.state_key != name else f"{name}@{id(h):x}"
            for ev in EVENTS:
                stat = self._stats.get((id(h), ev))
                if stat is not None and stat[0]:
                    out.append(HookTime(name, ev, int(stat[0]), stat[1]))
        return out

    def reset(self) -> None:
        """Forget every count and time."""
        for stat in self._stats.values():
            stat[0], stat[1] = 0, 0.0
