"""torch's learning-rate schedulers in a Trainer: stepped in a declared unit, checkpointed like trainwright's.

A :class:`TorchScheduler` holds one ``torch.optim.lr_scheduler.LRScheduler`` (``LambdaLR``, ``OneCycleLR``, Hugging
Face's ``get_cosine_schedule_with_warmup``…) built on the run's optimizer, or builds it from a factory that takes the
optimizer (the Trainer builds the optimizer after wrapping the model, so a factory is the way to pass one from a
config). It gives the scheduler what the param-scheduler hook and the checkpoint need: a unit and a state dict.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from trainwright.optim.scheduler.base import INF, OptimizerLike
from trainwright.registry import PARAM_SCHEDULERS

Factory = Callable[[torch.optim.Optimizer], LRScheduler]

#: torch's step-order warnings: the Trainer orders optimizer and scheduler steps itself (an
#: accumulation window or a skipped float16 step can leave the optimizer unstepped at first).
_ORDER_WARNINGS = (
    r"(Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`|Seems like `optimizer\.step\(\)` has "
    r"been overridden)"
)


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer of ``optimizer`` (itself, or an optim wrapper's ``.optimizer``)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(inner, torch.optim.Optimizer):
        raise TypeError(
            "A torch learning-rate scheduler needs a torch.optim.Optimizer (or an OptimWrapper holding one), got "
            f"{type(optimizer).__name__}; "
            "pass the run's optimizer (the Trainer does)."
        )
    return inner


@PARAM_SCHEDULERS.register()
class TorchScheduler:
    """A torch ``LRScheduler`` stepped once per unit by the Trainer and saved in its checkpoints.

    The Trainer makes one for any torch scheduler (or factory) given as ``param_scheduler``;
    ``dict(type=torch.optim.lr_scheduler.OneCycleLR, max_lr=0.1, total_steps=100)`` builds
    the class on the run's optimizer. Give the unit with ``by_epoch`` / ``by_update``:
    ``dict(type="TorchScheduler", scheduler=make_scheduler, by_epoch=True)``.

    The default unit is an optimizer update, the unit torch's own loops use (one ``scheduler.step()`` after each
    ``optimizer.step()``). :meth:`state_dict` / :meth:`load_state_dict` are torch's, which leave out plain functions:
    a resumed run is given its functions again and continues from the saved step.

    Args:
        optimizer: The run's optimizer, or its optim wrapper.
        scheduler: A torch ``LRScheduler`` built on that optimizer, or a function
            ``optimizer -> LRScheduler`` (called with the torch optimizer).
        by_epoch: Step once per epoch.
        by_update: Step once per optimizer update (per closed accumulation window). ``None``
            (default): ``not by_epoch``. ``by_epoch=False, by_update=False``: once per iteration.

    Raises:
        TypeError: ``scheduler`` is neither a torch ``LRScheduler`` nor a function returning one.
        ValueError: The scheduler drives another optimizer object than the run's; a
            ``ReduceLROnPlateau`` (it needs the validation metrics: use ``ReduceOnPlateauLR``);
            ``by_epoch=True`` with ``by_update=True``.
    """

    need_val_args = False
    begin = 0
    end = INF
    param_name = "lr"

    def __init__(
        self,
        optimizer: OptimizerLike,
        scheduler: LRScheduler | Factory,
        by_epoch: bool = False,
        by_update: bool | None = None,
    ) -> None:
        inner = _torch_optimizer(optimizer)
        if by_epoch and by_update:
            raise ValueError(
                "TorchScheduler: by_epoch=True and by_update=True name two units; give one (by_epoch=True: once per "
                "epoch, by_update=True: once per optimizer update)."
            )
        if isinstance(scheduler, LRScheduler):
            built = scheduler
        elif callable(scheduler) and not isinstance(scheduler, type):
            built = scheduler(inner)
            if not isinstance(built, LRScheduler):
                raise TypeError(
                    f"The param_scheduler factory {getattr(scheduler, '__name__', scheduler)!r} returned "
                    f"{type(built).__name__}, not a torch LRScheduler; "
                    "it must build one on the optimizer it is given, e.g. lambda optimizer: "
                    "torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)."
                )
        else:
            what = f"the class {scheduler.__name__}" if isinstance(scheduler, type) else f"{type(scheduler).__name__}"
            raise TypeError(
                f"param_scheduler got {what}; give a torch LRScheduler built on the run's optimizer, a function "
                "optimizer -> LRScheduler, "
                "or a config dict, e.g. dict(type=torch.optim.lr_scheduler.LambdaLR, lr_lambda=fn) or "
                "dict(type='CosineAnnealingLR', T_max=10)."
            )
        name = type(built).__name__
        if isinstance(built, ReduceLROnPlateau):
            raise ValueError(
                f"{name} needs the validation metrics at each step, which a torch scheduler cannot be given here; "
                "use trainwright's dict(type='ReduceOnPlateauLR', monitor='val/loss', rule='less', patience=...) "
                "instead."
            )
        if built.optimizer is not inner:
            raise ValueError(
                f"The {name} given as param_scheduler drives another optimizer object "
                f"({type(built.optimizer).__name__} at {id(built.optimizer):#x}) "
                f"than the run's ({type(inner).__name__} at {id(inner):#x}), so it would change no learning rate of "
                "this run. "
                f"Build it on the run's optimizer: pass a factory, param_scheduler=lambda optimizer: {name}(optimizer, "
                "...) "
                f"(or dict(type={name}, ...)), or pass the optimizer you built it on as optim_wrapper=that_optimizer."
            )
        self.optimizer = optimizer
        self.scheduler = built
        self.by_update = not by_epoch if by_update is None else bool(by_update)
        self.by_epoch = bool(by_epoch)
        self._quiet_first_step = False

    @property
    def name(self) -> str:
        """The torch scheduler's class name, for the run's log."""
        return f"{type(self.scheduler).__name__} (torch)"

    @property
    def unit(self) -> str:
        """What one :meth:`step` counts: ``"epoch"``, ``"update"`` (optimizer updates) or ``"iter"`` (iterations)."""
        return "epoch" if self.by_epoch else "update" if self.by_update else "iter"

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The scheduled optimizer's param groups."""
        return self.scheduler.optimizer.param_groups

    def step(self) -> None:
        """Step the torch scheduler once (one unit)."""
        if self._quiet_first_step:
            self._quiet_first_step = False
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_ORDER_WARNINGS, category=UserWarning)
                self.scheduler.step()
        else:
            self.scheduler.step()

    def disable_step_order_check(self) -> None:
        """Silence torch's step-order warning at the first step: the Trainer orders the calls itself (as for
        trainwright's schedulers)."""
        self._quiet_first_step = True

    def get_last_value(self) -> list[float]:
        """The learning rate of each param group after the latest step."""
        return [float(v) for v in self.scheduler.get_last_lr()]

    def state_dict(self) -> dict[str, Any]:
        """The torch scheduler's state (plain functions left out, as torch does) and its class name."""
        return {"type": type(self.scheduler).__name__, "state": self.scheduler.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state from :meth:`state_dict`; the functions are the ones this scheduler was built with.

        Raises:
            ValueError: The state is another scheduler class's.
        """
        own, saved = type(self.scheduler).__name__, state_dict.get("type")
        if saved != own or "state" not in state_dict:
            raise ValueError(
                f"The checkpoint's param scheduler state is a {saved}'s, this run's scheduler is a {own}; resume with "
                "the same param_scheduler."
            )
        self.scheduler.load_state_dict(dict(state_dict["state"]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.scheduler).__name__}, unit={self.unit!r})"


__all__ = ["TorchScheduler"]
