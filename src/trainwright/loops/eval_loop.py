"""Validation and test loops: one pass over the data, metrics from an Evaluator."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainwright.checkpoint.rng import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from trainwright.loops.context import LoopContext


class EvalLoop:
    """Runs ``model.val_step`` (or ``test_step``) over a loader and evaluates.

    Args:
        dataloader: Any iterable of batches (a DataLoader).
        evaluator: An :class:`~trainwright.evaluation.Evaluator`, or None (only losses /
            hooks run, metrics are empty).
        mode: ``"val"`` or ``"test"``; metric keys are prefixed ``"<mode>/"``.
        autocast: Run under the context's ``precision.autocast()`` (mixed precision only).
    """

    #: The context of the current (or last) run, set by :meth:`run` (the Trainer sets it at the start of every run).
    ctx: LoopContext | None = None

    def __init__(self, dataloader: Any, evaluator: Any = None, mode: str = "val", autocast: bool = False) -> None:
        if mode not in ("val", "test"):
            raise ValueError(f"mode must be 'val' or 'test', got {mode!r}")
        self.dataloader = dataloader
        self.evaluator = evaluator
        self.mode = mode
        self.autocast = autocast
        self._warned_no_evaluator = False

    def run(self, ctx: LoopContext) -> dict[str, float]:
        """One pass; returns the metrics (keys like ``"val/acc"``) and hands them to hooks.

        A stop request (``ctx.view.should_stop``: preemption, or a hook) ends the pass at the
        next batch; then there are no metrics: ``after_<mode>_epoch`` gets ``None`` (hooks
        still clean up, e.g. EMA swaps the training weights back), ``after_<mode>`` runs (a
        checkpoint due at this point is written) and ``{}`` is returned. A validation pass cut short sets
        ``progress.val_owed`` before its ``after_val_epoch`` hooks, so a run resumed from a checkpoint written then
        validates again.
        """
        self.ctx = ctx
        view, hooks, m = ctx.view, ctx.hooks, self.mode
        hooks.call(f"before_{m}", view)
        hooks.call(f"before_{m}_epoch", view)
        model = ctx.model
        was_training = model.training
        model.eval()
        raw = self.run_pass()
        metrics = None if raw is None else {f"{m}/{k}": v for k, v in raw.items()}
        if raw is None and m == "val":
            ctx.progress.val_owed = True  # cut by a stop: a checkpoint its hooks write owes it (validated on resume)
        hooks.call(f"after_{m}_epoch", view, metrics)
        hooks.call(f"after_{m}", view)
        model.train(was_training)
        return metrics or {}

    def run_pass(self, with_hooks: bool = True) -> dict[str, float] | None:
        """The pass over the data with the model as it is; metric keys without the mode prefix.

        ``with_hooks=False`` skips the per-iteration hook events (a hook evaluating the
        model a second time from inside an epoch event uses that). Returns None when a stop
        request ended the pass early (the partial results are dropped).
        """
        ctx = self.ctx
        if ctx is None:
            raise RuntimeError(
                f"{type(self).__name__}.run_pass() needs a run's context: call run(ctx) first, or run_pass from a hook "
                "during a run"
            )
        view, m = ctx.view, self.mode
        step: Callable[[Any], Any] = getattr(ctx.model, f"{m}_step")
        before, after = (
            (ctx.hooks.calls[f"before_{m}_iter"], ctx.hooks.calls[f"after_{m}_iter"]) if with_hooks else ((), ())
        )
        autocast = ctx.precision.autocast() if self.autocast else contextlib.nullcontext()
        n = 0
        cut = False
        rng = get_rng_state()
        try:
            with torch.no_grad(), autocast:
                for idx, batch in enumerate(self.dataloader):
                    for fn in before:
                        fn(view, idx, batch)
                    outputs = step(batch)
                    if self.evaluator is not None:
                        self.evaluator.process(batch, outputs)
                    for fn in after:
                        fn(view, idx, batch, outputs)
                    n += 1
                    if (
                        view.should_stop
                    ):  # a stop (preemption, agreed) ends the pass here, on every rank at the same batch
                        cut = True
                        break
        finally:
            # Evaluation never moves the random streams (not even a pass ended by an error):
            # training resumed from a checkpoint written after (or before) a validation pass
            # draws the same numbers as the run that validated.
            set_rng_state(rng)
        if cut:
            if self.evaluator is not None:
                self.evaluator.reset()
            ctx.logger.warning(
                f"{m} stopped after batch {n} by a stop request (trainer.should_stop, e.g. preemption): this pass has "
                "no metrics"
            )
            return None
        if n == 0:
            raise ValueError(f"{m}_dataloader is empty (0 batches); check its dataset and batch_size")
        if self.evaluator is None:
            if not self._warned_no_evaluator:
                self._warned_no_evaluator = True
                warnings.warn(
                    f"{m}() ran over the {m}_dataloader without a {m}_evaluator, so it reports no metrics; "
                    f"pass {m}_evaluator=tw.evaluation.Accuracy() (or another Metric / list of metrics) to the Trainer",
                    stacklevel=3,
                )
            return {}
        size = len(self.dataloader.dataset) if hasattr(self.dataloader, "dataset") else n
        return dict(self.evaluator.evaluate(size))
