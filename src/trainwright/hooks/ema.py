"""EMAHook: keep an exponential moving average of the weights and evaluate with it."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from trainwright.data.stream_state import batches_per_pass
from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.model.ema import ExponentialMovingAverage
from trainwright.registry import HOOKS

#: mmengine's / mmdet's averaged-model classes (``ema_type``): the annealing of the momentum and its default ``gamma``.
_EMA_TYPES: dict[str, tuple[str | None, float]] = {
    "ExponentialMovingAverage": (None, 100.0),
    "MomentumAnnealingEMA": ("linear", 100.0),
    "ExpMomentumEMA": ("exp", 2000.0),
}

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register
class EMAHook(Hook):
    """Average the weights during training; validate and test with the average.

    The average is built in ``before_train`` from ``trainer.unwrapped_model`` (after any
    resume or ``load_from`` is applied) and updated after training iterations, after the
    optimizer step, from the iteration mmengine's EMAHook starts at (see ``begin_iter`` /
    ``begin_epoch``). Until then the average *is* the live model: a validation evaluates the
    model itself and a checkpoint holds the model's current weights as the average (mmengine
    copies the weights into the average at every iteration before it begins; here they are
    read when asked, which costs nothing per step). Around each validation / test pass the
    averaged weights are swapped into the model and the training weights restored afterwards,
    bit for bit (also when the run ends with an error inside the pass).

    The hook's state (the averaged tensors and the update count) is saved with the
    checkpoint, so a resumed run continues the average exactly. A checkpoint without EMA state
    (e.g. from a run without this hook) starts the average from the loaded weights, with a
    warning.

    Args:
        momentum: Weight of the new weights in each update,
            ``avg = (1 - momentum) * avg + momentum * weights``.
        interval: Average every ``interval`` updates (the first update copies the weights).
        begin_iter: The 1-based iteration of the first update (mmengine: updates run while
            ``runner.iter + 1 >= begin_iter``); 0 or 1: from the first iteration.
        begin_epoch: The 1-based epoch whose first iteration makes the first update
            (mmengine: ``runner.epoch + 1 >= begin_epoch``); in an iteration-based run an epoch
            is a pass over the data. Set one of ``begin_iter`` / ``begin_epoch``, not both. A
            value past the end of the run is an error when training starts.
        update_buffers: Average floating buffers (BatchNorm statistics) too, instead of
            copying them.
        evaluate_on: ``"ema"`` evaluates the averaged weights only; ``"both"`` also runs a
            second pass with the training weights and adds its metrics as
            ``"val/raw/<name>"`` (``"test/raw/<name>"``) next to the averaged ones.
        device: Where to keep the average (the model's device by default); see
            :class:`~trainwright.model.ema.ExponentialMovingAverage`.
        strict_load: How a saved average whose keys or shapes differ from the model's loads
            (mmengine's ``strict_load``): False (default) loads the entries that match and
            warns naming the others, which start from the model's weights; True raises,
            naming them.
        ema_type: mmengine's ``ema_type``: ``"ExponentialMovingAverage"`` (default; ``momentum``
            throughout), ``"MomentumAnnealingEMA"`` (mmengine: ``max(momentum, gamma / (gamma +
            steps))``, ``gamma`` 100 by default) or ``"ExpMomentumEMA"`` (mmdet's RTMDet / YOLO
            configs: ``(1 - momentum) * exp(-(1 + steps) / gamma) + momentum``, ``gamma`` 2000 by
            default); ``steps`` counts the updates.
        gamma: The annealing's time scale in updates (annealed types only).
        update_per: When the average is updated under gradient accumulation:
            ``"iter"`` (default, mmengine's): after every training iteration, so with
            ``accumulative_counts=N`` it folds in the same weights N times per optimizer update
            (``momentum``, ``interval`` and ``gamma`` count iterations); ``"update"`` (timm's):
            after each iteration that stepped the optimizer (the last of each accumulation
            window), so they count optimizer updates. Without accumulation both are the same.
            ``"iter"`` stays the default so that mmengine configs keep their meaning.
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
        strict_load: bool = False,
        ema_type: str = "ExponentialMovingAverage",
        gamma: float | None = None,
        update_per: str = "iter",
    ) -> None:
        if ema_type not in _EMA_TYPES:
            hint = " (use SWAHook for a stochastic weight average)" if ema_type == "StochasticWeightAverage" else ""
            raise ValueError(f"EMAHook ema_type {ema_type!r} is not supported{hint}; use one of {sorted(_EMA_TYPES)}")
        anneal, default_gamma = _EMA_TYPES[ema_type]
        if gamma is not None and anneal is None:
            raise ValueError(
                f"EMAHook gamma={gamma} needs an annealed ema_type ('MomentumAnnealingEMA', 'ExpMomentumEMA'); "
                f"{ema_type!r} has none"
            )
        #: How the momentum is annealed (None, "linear", "exp") and its time scale: ``ema_type`` and ``gamma``.
        self.anneal, self.gamma = anneal, float(gamma if gamma is not None else default_gamma)
        if update_per not in ("iter", "update"):
            raise ValueError(
                "EMAHook update_per must be 'iter' (after every training iteration, mmengine's) or 'update' (after "
                "every optimizer "
                f"update, timm's), got {update_per!r}"
            )
        if evaluate_on not in ("ema", "both"):
            raise ValueError(f"EMAHook evaluate_on must be 'ema' or 'both', got {evaluate_on!r}")
        if begin_iter < 0 or begin_epoch < 0:
            raise ValueError(f"EMAHook begin_iter and begin_epoch must be >= 0, got {begin_iter} and {begin_epoch}")
        if begin_iter and begin_epoch:
            raise ValueError(
                f"EMAHook got begin_iter={begin_iter} and begin_epoch={begin_epoch}; set one of them (as in mmengine)"
            )
        # Validate momentum / interval now, not at the first iteration.
        if not 0.0 < float(momentum) <= 1.0:
            raise ValueError(
                f"EMAHook momentum must be in (0, 1] (the weight of the new value, e.g. 0.0002), got {momentum}; for a "
                "decay d use momentum = 1 - d"
            )
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"EMAHook interval must be an int >= 1, got {interval!r}")
        self.momentum = float(momentum)
        self.interval = interval
        self.begin_iter = begin_iter
        self.begin_epoch = begin_epoch
        self.update_buffers = update_buffers
        self.evaluate_on = evaluate_on
        self.device = device
        self.strict_load = strict_load
        self.update_per = update_per
        self.ema: ExponentialMovingAverage | None = None
        self._model: torch.nn.Module | None = None  # the module averaged (a run's unwrapped model)
        self._pending: Mapping[str, Any] | None = None
        self._first_iter = 1  # the 1-based iteration of the first update, placed by before_train
        self._stepped: Callable[[], bool] | None = (
            None  # update_per="update": whether the iteration just run stepped the optimizer
        )

    @override
    def before_train(self, trainer: TrainerView) -> None:
        """Build the average from the (possibly resumed) model; place the first update; check it is inside the run."""
        loop = require_train_loop(trainer, "EMAHook.before_train")
        epoch_len = batches_per_pass(loop.dataloader)
        if epoch_len is None and self.begin_epoch:
            raise ValueError(
                f"EMAHook begin_epoch={self.begin_epoch} counts epochs, but the train_dataloader is a stream without "
                "__len__ (an endless stream has no epochs): give begin_iter instead"
            )
        self._first_iter = self.first_update_iter(epoch_len or 1)
        if self._first_iter > loop.max_iters:
            epochs = (
                f" ({getattr(loop, 'max_epochs', '?')} epochs of {len(loop.dataloader)} iterations)"
                if loop.by_epoch
                else ""
            )
            name, value = ("begin_epoch", self.begin_epoch) if self.begin_epoch else ("begin_iter", self.begin_iter)
            raise ValueError(
                f"EMAHook {name}={value} starts averaging at iteration {self._first_iter}, but the run ends at "
                f"iteration {loop.max_iters}{epochs}: "
                f"the average would never be updated. Lower {name} or train longer"
            )
        self._stepped = None if self.update_per == "iter" else _optimizer_stepped(trainer.optim_wrapper)
        self._ensure(trainer)

    def first_update_iter(self, epoch_len: int) -> int:
        """The 1-based iteration of the first update for epochs of ``epoch_len`` iterations (mmengine's
        ``_ema_started``)."""
        if self.begin_epoch:
            return (self.begin_epoch - 1) * epoch_len + 1
        return max(self.begin_iter, 1)

    @override
    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        """Fold the weights just stepped into the average, once averaging has begun."""
        if trainer.progress.iteration < self._first_iter:
            return  # until then the average is the live model (read when asked: state_dict, evaluation)
        if self._stepped is not None and not self._stepped():
            return  # update_per="update": inside an accumulation window the weights have not moved
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
        """The average's state (empty before it is built, unless a loaded state is pending).

        Before the first update the average is the live model: its current weights are copied
        in first, so a checkpoint written before averaging begins holds the trained weights.
        """
        if self.ema is not None:
            if self.ema.steps == 0 and self._model is not None:
                self.ema.sync_from(self._model)
            return self.ema.state_dict()
        return dict(self._pending) if self._pending is not None else {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the average (see ``strict_load``); applied when the average is built if it is not yet."""
        if not state_dict:
            return
        if self.ema is not None:
            self._load(self.ema, state_dict)
        else:
            self._pending = state_dict

    def _load(self, ema: ExponentialMovingAverage, state: Mapping[str, Any]) -> None:
        saved = state["averaged"]
        own = ema.averaged
        missing = [k for k in own if k not in saved]
        unexpected = [k for k in saved if k not in own]
        reshaped = [k for k, v in own.items() if k in saved and tuple(saved[k].shape) != tuple(v.shape)]
        if not (missing or unexpected or reshaped):
            ema.load_state_dict(state)
            return
        shapes = [f"{k}: saved {tuple(saved[k].shape)}, model {tuple(own[k].shape)}" for k in reshaped]
        parts = [
            f"missing keys {missing}" if missing else "",
            f"unexpected keys {unexpected}" if unexpected else "",
            f"shape mismatches {shapes}" if shapes else "",
        ]
        problem = "; ".join(part for part in parts if part)
        if self.strict_load:
            raise KeyError(
                f"EMAHook: the saved average does not match the model ({problem}). Resume with the model the average "
                "was saved from, "
                "or pass EMAHook(strict_load=False) to load the entries that match (the others start from the model's "
                "weights)"
            )
        merged = {k: saved[k] if k in saved and k not in reshaped else v for k, v in own.items()}
        ema.load_state_dict({"steps": state["steps"], "averaged": merged})
        warnings.warn(
            f"EMAHook: loaded the saved average where it matches the model; {problem} (those start from the model's "
            "weights)",
            stacklevel=3,
        )

    def _ensure(self, trainer: TrainerView) -> ExponentialMovingAverage:
        self._model = trainer.unwrapped_model
        if self.ema is None:
            self.ema = ExponentialMovingAverage(
                self._model, self.momentum, self.update_buffers, self.interval, self.device, self.anneal, self.gamma
            )
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._load(self.ema, pending)
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
        raw = (
            _evaluate_pass(trainer, mode)
            if swapped
            else {k[len(mode) + 1 :]: v for k, v in metrics.items() if k.startswith(f"{mode}/")}
        )
        metrics.update({f"{mode}/raw/{k}": v for k, v in raw.items()})

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(momentum={self.momentum}, interval={self.interval}, begin_iter={self.begin_iter}, "
            f"begin_epoch={self.begin_epoch}, "
            f"evaluate_on={self.evaluate_on!r}, strict_load={self.strict_load}, update_per={self.update_per!r})"
        )


def _optimizer_stepped(optim_wrapper: Any) -> Callable[[], bool]:
    """The run's optim wrapper's ``should_update``: True after the micro-batch that closed an accumulation window
    (its update)."""
    should_update = getattr(optim_wrapper, "should_update", None)
    if not callable(should_update):
        raise ValueError(
            "EMAHook(update_per='update') follows the updates of one optim wrapper, and this run has "
            f"{type(optim_wrapper).__name__} "
            "(several optimizers update at different times, or none is built): use update_per='iter'"
        )
    return should_update


def _evaluate_pass(trainer: TrainerView, mode: str) -> dict[str, float]:
    """One hook-free pass of ``trainer.<mode>_loop`` with the model as it is; bare metric keys."""
    loop = getattr(trainer, f"{mode}_loop", None)
    if loop is None or getattr(loop, "evaluator", None) is None:
        return {}
    return loop.run_pass(with_hooks=False) or {}  # None: a stop request cut the pass
