"""ParamSchedulerHook: steps the learning-rate / momentum schedulers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.optim.scheduler.builder import flatten_schedulers
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register
class ParamSchedulerHook(Hook):
    """Steps iteration-based schedulers after every iteration, epoch-based after every epoch.

    Metric-driven schedulers (``need_val_args``, e.g. ``ReduceOnPlateauLR``) are also stepped
    with the validation metrics after each validation that runs during training (a
    ``trainer.val()`` on its own does not step them). The schedulers' first-step misuse
    check is turned off: the trainer calls ``optimizer.step()`` before ``scheduler.step()``.
    """

    priority = "LOW"

    def __init__(self) -> None:
        self._iter: list[Any] = []
        self._epoch: list[Any] = []
        self._val: list[Any] = []
        self._in_train = False

    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        all_s = flatten_schedulers(trainer.param_schedulers)
        for s in all_s:
            s.disable_step_order_check()
        self._iter = [s for s in all_s if not s.by_epoch]
        self._epoch = [s for s in all_s if s.by_epoch]
        self._val = [s for s in all_s if s.need_val_args]
        self._in_train = True

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        self._in_train = False

    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        if self._in_train:
            for s in self._val:
                s.step(metrics or {})

    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        return 1 if self._iter else 0  # only iteration-based schedulers step per iteration

    def after_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        for s in self._iter:
            s.step()

    def after_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        for s in self._epoch:
            s.step()
