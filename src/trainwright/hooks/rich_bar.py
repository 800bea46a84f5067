"""The live display behind :class:`~trainwright.hooks.progress_bar.ProgressBarHook` (rich).

Imported only when a bar is shown, so ``import trainwright`` does not load rich. The bars
pull their counts when rich draws them — on rich's refresh thread, a few times a second —
from callables reading counters the loops keep anyway: the training loop does no work for
the bar. Each bar is one styled line of text (no table layout), so a redraw is cheap.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.file_proxy import FileProxy
from rich.live import Live
from rich.text import Text

#: Returns ``(completed, description)`` when the bar is drawn.
Source = Callable[[], tuple[int, str]]

_WIDTH = 30  # characters of the bar itself
_SPEED_WINDOW = 30.0  # seconds of history behind it/s and the ETA


class _Bar:
    """One bar: where its numbers come from and the recent (time, completed) samples."""

    def __init__(self, source: Source, total: int | None, now: float) -> None:
        self.source = source
        self.total = total
        self.stats = ""
        self.start = now
        completed, _ = source()
        self.samples: deque[tuple[float, int]] = deque([(now, completed)])

    def line(self, now: float) -> Text:
        completed, description = self.source()
        samples = self.samples
        samples.append((now, completed))
        while len(samples) > 2 and now - samples[0][0] > _SPEED_WINDOW:
            samples.popleft()
        t0, c0 = samples[0]
        speed = (completed - c0) / (now - t0) if now > t0 and completed > c0 else 0.0
        total = self.total
        if total:
            done = min(_WIDTH, int(_WIDTH * completed / total))
            count = f"{completed}/{total}".rjust(2 * len(str(total)) + 1)
            eta = (
                _hms((total - completed) / speed)
                if speed and completed < total
                else ("0:00:00" if completed >= total else "-:--:--")
            )
        else:
            done, count, eta = 0, str(completed), "-:--:--"
        text = Text.assemble(
            (description.ljust(16), "progress.description"),
            " ",
            ("━" * done, "bar.complete"),
            ("━" * (_WIDTH - done), "bar.back"),
            " ",
            (count, "progress.download"),
            " ",
            (f"{speed:.2f} it/s" if speed else "-- it/s", "progress.data.speed"),
            " ",
            (_hms(now - self.start), "progress.elapsed"),
            " eta ",
            (eta, "progress.remaining"),
            "  ",
            self.stats,
        )
        text.no_wrap = True
        text.overflow = "ellipsis"
        return text


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class LiveBar:
    """Bars drawn by a rich ``Live`` display; each pulls its position from a :data:`Source` when drawn.

    Args:
        stream: The terminal (the stream the trainer's console log goes to).
        refresh_per_second: How often rich's thread redraws.
        force: Draw even when ``stream`` is not a terminal.
    """

    def __init__(self, stream: TextIO, refresh_per_second: float, force: bool = False) -> None:
        self.console = Console(file=stream, force_terminal=True if force else None)
        self._bars: dict[int, _Bar] = {}
        self._ids = itertools.count()
        self._live = Live(
            console=self.console,
            get_renderable=self.render,
            refresh_per_second=refresh_per_second,
            redirect_stdout=True,  # print() and warnings go above the bars
            redirect_stderr=True,
        )

    def start(self) -> None:
        """Start drawing (rich's refresh thread)."""
        self._live.start()

    def stop(self) -> None:
        """Draw the final positions and stop the display (the bars stay on screen)."""
        self._live.stop()

    def add_source(self, source: Source, total: int | None) -> int:
        """A bar that shows ``source()`` out of ``total`` (None: unknown); returns its id."""
        key = next(self._ids)
        self._bars[key] = _Bar(source, total, time.monotonic())
        return key

    def remove_source(self, key: int) -> None:
        """Drop that bar."""
        self._bars.pop(key, None)

    def set_stats(self, key: int, stats: str) -> None:
        """The text shown at the end of that bar (latest loss, lr)."""
        bar = self._bars.get(key)
        if bar is not None:
            bar.stats = stats

    def lines_above(self) -> TextIO:
        """A stream whose lines are printed above the bars."""
        return FileProxy(self.console, self.console.file)  # type: ignore[return-value] # a TextIOBase that writes through the console

    def render(self) -> Text:
        """The bars, one line each (called by rich under its display lock whenever it draws)."""
        now = time.monotonic()
        return Text("\n").join([bar.line(now) for bar in list(self._bars.values())])
