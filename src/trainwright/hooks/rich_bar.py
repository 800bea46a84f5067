"""The live display behind :class:`~trainwright.hooks.progress_bar.ProgressBarHook` (rich).

Imported only when a bar is shown, so ``import trainwright`` does not load rich. The bars
pull their counts when rich draws them — on rich's refresh thread, a few times a second —
from callables reading counters the loops keep anyway: the training loop does no work for
the bar.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console
from rich.file_proxy import FileProxy
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

#: Returns ``(completed, description)`` when the bar is drawn.
Source = Callable[[], tuple[int, str]]


class _Speed(ProgressColumn):
    """Iterations per second (rich's estimate over the last 30 s)."""

    def render(self, task: Task) -> Text:  # noqa: D102
        speed = task.finished_speed or task.speed
        return Text(f"{speed:.2f} it/s" if speed else "-- it/s", style="progress.data.speed")


class LiveBar(Progress):
    """A rich ``Progress`` whose tasks read their position from :data:`Source` callables each time it is drawn.

    Args:
        stream: The terminal (the stream the trainer's console log goes to).
        refresh_per_second: How often rich's thread redraws.
        force: Draw even when ``stream`` is not a terminal.
    """

    def __init__(self, stream: TextIO, refresh_per_second: float, force: bool = False) -> None:
        self._sources: dict[TaskID, Source] = {}
        console = Console(file=stream, force_terminal=True if force else None)
        super().__init__(
            TextColumn("{task.description}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            _Speed(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
            console=console,
            refresh_per_second=refresh_per_second,
            redirect_stdout=True,  # print() and warnings go above the bars
            redirect_stderr=True,
        )

    def add_source(self, source: Source, total: int | None) -> TaskID:
        """A bar that shows ``source()`` out of ``total`` (None: unknown)."""
        completed, description = source()
        task = self.add_task(description, total=total, completed=completed, stats="")
        self._sources[task] = source
        return task

    def remove_source(self, task: TaskID) -> None:
        """Draw that bar once more, then drop it."""
        self._pull()
        self._sources.pop(task, None)
        self.remove_task(task)

    def set_stats(self, task: TaskID, stats: str) -> None:
        """The text shown at the end of that bar (latest loss, lr)."""
        self.update(task, stats=stats)

    def lines_above(self) -> TextIO:
        """A stream whose lines are printed above the bars."""
        return FileProxy(self.console, self.console.file)  # type: ignore[return-value] # a TextIOBase that writes through the console

    def stop(self) -> None:
        """Draw the final positions and stop the display (the bars stay on screen)."""
        self._pull()
        super().stop()

    def _pull(self) -> None:
        for task, source in list(self._sources.items()):
            completed, description = source()
            self.update(task, completed=completed, description=description)

    def get_renderables(self) -> Any:  # noqa: D102 - called by rich whenever it draws
        self._pull()
        yield from super().get_renderables()
