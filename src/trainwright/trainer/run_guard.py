"""One run (train / val / test) between ``before_run`` and its clean-up, and what a failed run leaves behind.

On an error the order is: the failure is noted at once (no collective from here on; under
several processes the error is left for the other ranks), the held log lines and the hooks'
``after_run`` are written, and the reason is logged last, so ``tail train.log`` says why the
run stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainwright.data.collate import pseudo_collate_hint
from trainwright.logging.nonfinite_error import NonFiniteLossError
from trainwright.trainer.runs import remove_unused_run_dir

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer


class RunGuard:
    """Runs a trainer's loops and reports their failures; knows whether a run started and whether one is in progress."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        #: A run started: the run folder holds its traces.
        self.ran = False
        #: A run is in progress (the tuners refuse to start inside one).
        self.running = False
        self._noted: BaseException | None = None  # the last failure noted (and logged)

    def remove_unused_folder(self, created: bool) -> None:
        """After a refused ``train()`` (another process trains in the work_dir): the run folder goes if this trainer
        ``created`` it and no run started in it (a refused job leaves no folder)."""
        t = self.trainer
        if created and not self.ran and t.strategy.is_main_process:
            t.log_lines.writers.flush()
            remove_unused_run_dir(t.run_dir, t.logger)

    def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` between the hooks' ``before_run`` and the clean-up; on an error, ``train.log`` ends with its
        reason."""
        t = self.trainer
        t.strategy.run_failed = False
        self.ran = self.running = True
        t.hooks.call("before_run", t)
        ok = False
        failure: tuple[BaseException, str | None] | None = None
        try:
            out = fn()
            t.metric_store.flush()  # lines still pending go out first (a NaN among them is the run's error)
            ok = True
            return out
        except (
            NonFiniteLossError
        ) as e:  # explained here, where the run is known; the user gets the FloatingPointError it always was
            error = self.explained(e)
            failure = (error, self.note_failure(error))
            raise error.with_traceback(e.__traceback__) from None
        except BaseException as e:
            failure = (e, self.note_failure(e))
            raise
        finally:
            try:
                if (
                    not ok
                ):  # the held lines' numbers, this process's own: nothing is exchanged, a NaN raises no second error
                    t.metric_store.flush(raise_on_nonfinite=False)
            finally:
                try:
                    self._clean_up(ok)
                finally:
                    if failure is not None:
                        _log_failure(t.logger, *failure)
            self.running = False
            if ok:
                # writers_fail="raise": an error held for a checkpoint still due at the end
                t.log_lines.writers.raise_held()

    def explained(self, e: NonFiniteLossError) -> FloatingPointError:
        """The error a non-finite loss stops the run with: ``e``'s message with where the value came from (a replay;
        never raises).

        Every process takes the same path (each replays its own batch); see
        :func:`trainwright.diagnose.explain_nonfinite`.
        """
        if not e.explanation:
            from trainwright.diagnose import explain_nonfinite  # imported when first needed: a replay is rare

            e.explanation = explain_nonfinite(self.trainer, e.iteration)
        return FloatingPointError(str(e))

    def failed_outside_a_run(self, e: BaseException) -> None:
        """``train()`` failed before its loop ran (building, resuming, the ranks' check): note and log it as a run's
        failure."""
        noted = (
            e is self._noted
        )  # the run's own failure, logged when it was noted (an error raised on every rank leaves run_failed unset)
        if (
            not noted and not self.trainer.strategy.run_failed and not isinstance(e, SystemExit)
        ):  # SystemExit: a preemption's agreed exit
            _log_failure(self.trainer.logger, e, self.note_failure(e))

    def refuse_inside_run(self, name: str) -> None:
        """A tuner replaces the train loader's iterator and the optimizer's state for a while: not while a run uses
        them."""
        if self.running:
            raise RuntimeError(
                f"{name}() was called while train() / val() / test() runs (from a hook?): the running loop holds the "
                "train loader's "
                f"iterator and the optimizer, which {name} would change under it. Call it before train() or after it "
                "returns."
            )

    def note_failure(self, e: BaseException) -> str | None:
        """A run failed on this process: no collective from here on (see ``Strategy.run_failed``); returns the line that
        says why (None: nothing to log).

        Under several processes the error is left for the other ranks (the launcher's store),
        and theirs are named in the line: a rank whose collective failed because a peer
        stopped names that peer's error.
        """
        t = self.trainer
        self._noted = e
        where = t.progress.where(t.train_loop is None or t.train_loop.by_epoch)  # numbered as the log lines are
        loops = (t.train_loop, t.val_loop, t.test_loop)
        hint = pseudo_collate_hint(e, [loop.dataloader for loop in loops if loop is not None])
        if hint and hasattr(e, "add_note"):  # shown with the traceback too (Python 3.11+)
            e.add_note(hint)
        message = f": {e}" if str(e) else ""  # a bare KeyboardInterrupt has none
        if getattr(
            e, "raised_on_every_rank", False
        ):  # the ranks are together (e.g. their settings differ): nothing to leave for the others
            return f"Stopped by {type(e).__name__} {where}{message}"
        others = t.strategy.report_failure(e, where)
        t.strategy.run_failed = True
        if isinstance(e, SystemExit):  # a preemption exit is logged by its hook
            return None
        rank = f" on rank {t.strategy.rank}" if t.strategy.world_size > 1 else ""
        line = f"{message}{f' ({hint})' if hint else ''}"
        if others and line.endswith("."):  # the other ranks' errors follow after "; "
            line = line[:-1]
        return f"Stopped by {type(e).__name__}{rank} {where}{line}{others}"

    def _clean_up(self, ok: bool) -> None:
        """Run every hook's ``after_run`` even if some raise; then the original error (if any) goes on.

        A cleanup error is logged by name; it is raised only when the run itself succeeded
        (the first one; a preemption's ``SystemExit`` among them is what the process exits with).
        """
        t = self.trainer
        failed = t.hooks.call_all("after_run", t)
        for fn, e in failed:
            if not isinstance(e, SystemExit):
                t.logger.error(
                    f"{getattr(fn, '__qualname__', fn)} failed while the run was cleaning up: {type(e).__name__}: {e}",
                    exc_info=e,
                )
        with (
            t.log_lines.writers.holding()
        ):  # a writer's error (writers_fail="raise") never hides the run's own; run() raises it after a success
            t.flush_logs()
        if ok and failed:
            raise next((e for _, e in failed if isinstance(e, SystemExit)), failed[0][1])


def _log_failure(logger: logging.Logger, e: BaseException, line: str | None) -> None:
    """Log the error's traceback, then ``line`` (the reason) as the last line, and make both visible on disk."""
    if line is None:
        return
    if not getattr(e, "raised_on_every_rank", False):
        logger.error(f"Traceback of the {type(e).__name__} that stopped the run:", exc_info=e)
    logger.error(line)
    for h in logger.handlers:
        h.flush()
