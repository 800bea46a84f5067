"""EMAHook: keep an exponential moving average of the weights and evaluate with it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from trainwright.hooks.hook import Hook
from trainwright.model.ema import ExponentialMovingAverage
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register
class EMAHook(Hook):
    """Average the weights during training; validate and test with the average.

    The average is built in ``before_train`` from ``trainer.unwrapped_model`` (after any
    resume or ``load_from`` is applied) and updated after every training iteration, after
    the optimizer step. Around each validation / test pass the averaged weights are swapped
    into the model and the training weights restored afterwards, bit for bit (also when the
    run ends with an error inside the pass).

    The hook's state (the averaged tensors and the update count) is saved with the
    checkpoint, so a resumed run continues the average exactly.

    Args:
        momentum: Weight of the new weights in each update,
            ``avg = (1 - momentum) * avg + momentum * weights``.
        interval: Average every ``interval`` iterations.
        begin_iter: 0-based iteration at which averaging starts; until then the model is
            evaluated with its own weights.
        begin_epoch: 0-based epoch at which averaging starts (both conditions must hold).
        update_buffers: Average floating buffers (BatchNorm statistics) too, instead of
            copying them.
        evaluate_on: ``"ema"`` evaluates the averaged weights only; ``"both"`` also runs a
            second pass with the training weights and adds its metrics as
            ``"val/raw/<name>"`` (``"test/raw/<name>"``) next to the averaged ones.
        device: Where to keep the average (the model's device by default); see
            :class:`~trainwright.model.ema.ExponentialMovingAverage`.
    """

    priority = "NORMAL"

    def __init__(
        self,
        momentum: float = 0.0002,
        interval: int = 1,
        begin_iter: int = 0,
        begin_epoch: int = 0,
        update_buffers: bool = False,
        evaluate_on: str = "ema",
        device: torch.device | str | None = None,
    ) -> None:
        if evaluate_on not in ("ema", "both"):
            raise ValueError(f"EMAHook evaluate_on must be 'ema' or 'both', got {evaluate_on!r}")
        if begin_iter < 0 or begin_epoch < 0:
            raise ValueError(f"EMAHook begin_iter and begin_epoch must be >= 0, got {begin_iter} and {begin_epoch}")
        # Validate momentum / interval now, not at the first iteration.
        if not 0.0 < float(momentum) <= 1.0:
            raise ValueError(f"EMAHook momentum must be in (0, 1] (the weight of the new value, e.g. 0.0002), got {momentum}; for a decay d use momentum = 1 - d")
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"EMAHook interval must be an int >= 1, got {interval!r}")
        self.momentum = float(momentum)
        self.interval = interval
        self.begin_iter = begin_iter
        self.begin_epoch = begin_epoch
        self.update_buffers = update_buffers
        self.evaluate_on = evaluate_on
        self.device = device
        self.ema: ExponentialMovingAverage | None = None
        self._pending: Mapping[str, Any] | None = None

    @override
    def before_train(self, trainer: TrainerView) -> None:
        """Build the average from the (possibly resumed) model; apply a loaded state."""
        self._ensure(trainer)

    @override
    def after_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:
        """Fold the weights just stepped into the average, once averaging has begun."""
        progress = trainer.progress
        if progress.iteration - 1 < self.begin_iter or progress.epoch < self.begin_epoch:
            return
        ema = self.ema if self.ema is not None else self._ensure(trainer)
        ema.update_parameters(trainer.unwrapped_model)

    @override
    def before_val_epoch(self, trainer: TrainerView) -> None:
        """Swap the averaged weights in for validation."""
        self._swap_in(trainer)

    @override
    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:
        """Swap the training weights back (and, for ``"both"``, evaluate them too)."""
        self._swap_out(trainer, "val", metrics)

    @override
    def before_test_epoch(self, trainer: TrainerView) -> None:
        """Swap the averaged weights in for testing."""
        self._swap_in(trainer)

    @override
    def after_test_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:
        """Swap the training weights back (and, for ``"both"``, evaluate them too)."""
        self._swap_out(trainer, "test", metrics)

    @override
    def after_run(self, trainer: TrainerView) -> None:
        """Restore the training weights if a pass ended by an error while swapped in."""
        if self.ema is not None and self.ema.swapped_in:
            self.ema.swap_out(trainer.unwrapped_model)

    def state_dict(self) -> dict[str, Any]:
        """The average's state (empty before it is built, unless a loaded state is pending)."""
        if self.ema is not None:
            return self.ema.state_dict()
        return dict(self._pending) if self._pending is not None else {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the average; applied when the average is built if it is not yet."""
        if not state_dict:
            return
        if self.ema is not None:
            self.ema.load_state_dict(state_dict)
        else:
            self._pending = state_dict

    def _ensure(self, trainer: TrainerView) -> ExponentialMovingAverage:
        if self.ema is None:
            self.ema = ExponentialMovingAverage(trainer.unwrapped_model, self.momentum, self.update_buffers, self.interval, self.device)
        if self._pending is not None:
            self.ema.load_state_dict(self._pending)
            self._pending = None
        return self.ema

    def _swap_in(self, trainer: TrainerView) -> None:
        # Without a loaded or accumulated average (e.g. validating before `begin_iter`)
        # the model's own weights are what there is to evaluate.
        if self.ema is None and self._pending is None:
            return
        ema = self._ensure(trainer)
        if ema.steps > 0:
            ema.swap_in(trainer.unwrapped_model)

    def _swap_out(self, trainer: TrainerView, mode: str, metrics: dict[str, float] | None) -> None:
        swapped = self.ema is not None and self.ema.swapped_in
        if swapped:
            self.ema.swap_out(trainer.unwrapped_model)  # type: ignore[union-attr]
        if self.evaluate_on != "both" or metrics is None:
            return
        # The pass just run used the training weights when nothing was swapped in.
        raw = _evaluate_pass(trainer, mode) if swapped else {k[len(mode) + 1 :]: v for k, v in metrics.items() if k.startswith(f"{mode}/")}
        metrics.update({f"{mode}/raw/{k}": v for k, v in raw.items()})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(momentum={self.momentum}, interval={self.interval}, begin_iter={self.begin_iter}, begin_epoch={self.begin_epoch}, evaluate_on={self.evaluate_on!r})"


def _evaluate_pass(trainer: TrainerView, mode: str) -> dict[str, float]:
    """One hook-free pass of ``trainer.<mode>_loop`` with the model as it is; bare metric keys."""
    loop = getattr(trainer, f"{mode}_loop", None)
    if loop is None or getattr(loop, "evaluator", None) is None:
        return {}
    return loop.run_pass(with_hooks=False) or {}  # None: a stop request cut the pass
