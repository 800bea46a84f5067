"""ProgressBarHook: a live progress bar on a terminal, plain log lines everywhere else.

Decided once per run (``before_run``): on the main process, when the console log goes to a
terminal (or ``enable=True``), rich's own thread draws a bar for training and one per
validation / test pass; log lines, ``print()`` and warnings are printed above them.
Elsewhere (CI, ``nohup``, SLURM logs, other ranks) nothing changes, and ``train.log`` never
receives the bar. The training bar reads ``trainer.progress`` when drawn; loss and lr come with
the logger hook's records, through :meth:`ProgressBarHook.records_writer` (added by the trainer).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.logging.logger import console_stream, set_console_stream
from trainwright.logging.writers import LineInfo, Writer
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register
class ProgressBarHook(Hook):
    """A live bar (iterations, it/s, elapsed, ETA, latest loss and lr) for training, validation and test on a terminal.

    Stock hook ``progress_bar``: ``default_hooks=dict(progress_bar=dict(enable=True))`` forces
    it, ``progress_bar=None`` (or ``enable=False``) switches it off.

    Args:
        enable: ``"auto"``: when the console log goes to a terminal (``isatty()``, and
            ``TERM`` is not ``dumb``), checked at the start of each run; ``True``: always
            (escape codes even into a file); ``False``: never. Only the main process draws.
        refresh_per_second: How often the bar is redrawn (by rich's thread; a redraw takes
            the interpreter for well under a millisecond).
    """

    priority = "VERY_LOW"

    def __init__(self, enable: bool | str = "auto", refresh_per_second: float = 2.0) -> None:
        if enable not in (True, False, "auto"):
            raise ValueError(f"ProgressBarHook enable must be True, False or 'auto', got {enable!r}")
        if not refresh_per_second > 0:
            raise ValueError(f"ProgressBarHook refresh_per_second must be > 0, got {refresh_per_second!r}")
        self.enable = enable
        self.refresh_per_second = refresh_per_second
        self._bar: Any = None  # the LiveBar while a run shows one
        self._stream: Any = None
        self._train_task: Any = None
        self._eval_task: Any = None
        self._eval_done = 0
        self._writer = _BarWriter(self)

    def records_writer(self, logger: logging.Logger) -> Writer | None:
        """The writer that shows each training record's losses and learning rates on the training bar (added by whoever
        builds the writers).

        None where no bar can be drawn (``enable=False``, or ``"auto"`` and ``logger``'s console is no terminal).
        """
        return self._writer if self._draws_on(logger) else None

    def bar_task(self) -> tuple[Any, Any]:
        """The live bar and its training task while training is shown, else ``(None, None)``."""
        return (self._bar, self._train_task) if self._bar is not None and self._train_task is not None else (None, None)

    @property
    def active(self) -> bool:
        """Whether a bar is shown in the current run."""
        return self._bar is not None

    def shows_bar(self, trainer: TrainerView) -> bool:
        """The decision :meth:`before_run` takes: main process, and a terminal (``"auto"``) or ``enable=True``."""
        return trainer.strategy.is_main_process and self._draws_on(trainer.logger)

    def _draws_on(self, logger: logging.Logger) -> bool:
        """Whether a bar is drawn for ``logger``'s console: ``enable=True``, or ``"auto"`` and a terminal."""
        if self.enable is False:
            return False
        stream = console_stream(logger)
        if stream is None:
            return False
        if self.enable is True:
            return True
        try:
            return bool(stream.isatty()) and os.environ.get("TERM", "") != "dumb"
        except (AttributeError, ValueError, OSError):  # a closed or odd stream
            return False

    # -- the run --------------------------------------------------------------------------
    def before_run(self, trainer: TrainerView) -> None:  # noqa: D102
        if not self.shows_bar(trainer):
            return
        try:
            from trainwright.hooks.rich_bar import LiveBar  # rich is loaded only when a bar is shown
        except ImportError as e:
            if self.enable is True:
                raise ImportError(f"ProgressBarHook(enable=True) needs rich: pip install rich ({e})") from e
            trainer.logger.warning(
                f"No progress bar: rich is not installed ({e}); pip install rich, or set "
                "default_hooks=dict(progress_bar=None)"
            )
            return
        self._stream = console_stream(trainer.logger)
        self._bar = LiveBar(self._stream, self.refresh_per_second, force=self.enable is True)
        self._bar.start()
        set_console_stream(trainer.logger, self._bar.lines_above())  # log lines go above the bar

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102 - also after an error
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.stop()
            set_console_stream(trainer.logger, self._stream)
        self._train_task = self._eval_task = None

    # -- training -------------------------------------------------------------------------
    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        bar = self._bar
        if bar is None:
            return
        loop = require_train_loop(trainer, "ProgressBarHook.before_train")
        progress = trainer.progress
        total = loop.max_iters
        if loop.by_epoch:
            epochs = max(1, total // max(1, len(loop.dataloader)))

            def source() -> tuple[int, str]:
                return progress.iteration, f"train epoch {min(progress.epoch + 1, epochs)}/{epochs}"
        else:

            def source() -> tuple[int, str]:
                return progress.iteration, "train"

        self._train_task = bar.add_source(
            source, total
        )  # the logger hook's records bring the loss and lr (records_writer)

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._train_task = None  # records written after training (evaluation) are not shown on a training bar

    # -- validation and test --------------------------------------------------------------
    def before_val_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self._start_eval(trainer.val_loop, "val")

    def before_test_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self._start_eval(trainer.test_loop, "test")

    def after_val_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:  # noqa: D102
        self._eval_done += 1

    def after_test_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:  # noqa: D102
        self._eval_done += 1

    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        self._end_eval()

    def after_test_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        self._end_eval()

    def _start_eval(self, loop: Any, mode: str) -> None:
        self._eval_done = 0
        if self._bar is None:
            return
        try:
            total: int | None = len(loop.dataloader)
        except (AttributeError, TypeError):
            total = None
        self._eval_task = self._bar.add_source(lambda: (self._eval_done, mode), total)

    def _end_eval(self) -> None:
        if self._bar is not None and self._eval_task is not None:
            self._bar.remove_source(self._eval_task)
        self._eval_task = None


class _BarWriter(Writer):
    """Shows the latest training record's losses and learning rates at the end of the training bar."""

    def __init__(self, hook: ProgressBarHook) -> None:
        self.hook = hook

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:  # noqa: D102
        bar, task = self.hook.bar_task()
        if bar is None:  # no training bar drawn (no terminal, another process, outside training)
            return
        rec = records[-1]
        shown = [f"{k} {v:.4f}" for k, v in rec.items() if "loss" in k and isinstance(v, float)]
        shown += [f"{k} {v:.2e}" for k, v in rec.items() if (k == "lr" or k.endswith(".lr")) and isinstance(v, float)]
        bar.set_stats(task, "  ".join(shown))
