"""ParamSchedulerHook: steps the learning-rate / momentum schedulers, each in its unit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.optim.scheduler.builder import UNIT_WORDS, flatten_schedulers
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


def _unit(scheduler: Any) -> str:
    """``"epoch"``, ``"update"`` or ``"iter"``: what one step of ``scheduler`` counts."""
    unit = getattr(scheduler, "unit", None)
    return unit if unit in UNIT_WORDS else "epoch" if scheduler.by_epoch else "iter"


def _wrapper_of(scheduler: Any, wrappers: dict[str, Any]) -> Any:
    """The run's optim wrapper whose updates ``scheduler`` counts (it drives the wrapper or its optimizer)."""
    driven = scheduler.optimizer
    for ow in wrappers.values():
        if driven is ow or driven is ow.optimizer:
            return ow
    raise ValueError(
        f"param_scheduler {type(scheduler).__name__} counts optimizer updates (by_update=True) but drives an optimizer "
        "that is not this run's "
        f"({type(driven).__name__}), so it cannot know when the run updates. Give it as a config dict or a factory, "
        "which the Trainer builds on "
        "the run's optimizer, or build it on the optimizer passed as optim_wrapper."
    )


@HOOKS.register
class ParamSchedulerHook(Hook):
    """Steps each scheduler once per unit: after every iteration, every optimizer update, or every epoch.

    An iteration is one micro-batch (mmengine's unit); an optimizer update is one closed
    accumulation window (``accumulative_counts`` iterations, and the shorter window at the end
    of an epoch or run; counted even when a float16 overflow or a guard skips the step), the
    unit of ``by_update=True`` schedulers and of torch schedulers (nanoGPT's and Hugging Face's
    loops step theirs after each ``optimizer.step()``). With ``accumulative_counts > 1`` (or a
    per-update schedule) one INFO line at the start of training says the unit of each schedule.

    Metric-driven schedulers (``need_val_args``, e.g. ``ReduceOnPlateauLR``) are also stepped
    with the validation metrics after each validation that runs during training (a
    ``trainer.val()`` on its own does not step them). The schedulers' first-step misuse
    check is turned off: the trainer calls ``optimizer.step()`` before ``scheduler.step()``.
    """

    priority = "LOW"

    def __init__(self) -> None:
        self._iter: list[Any] = []
        self._update: list[tuple[Any, list[Any]]] = []  # (optim wrapper, the schedulers counting its updates)
        self._counts: list[int] = []  # each wrapper's micro-batch count before the iteration
        self._epoch: list[Any] = []
        self._val: list[Any] = []
        self._in_train = False

    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        all_s = flatten_schedulers(trainer.param_schedulers)
        for s in all_s:
            s.disable_step_order_check()
        units = [_unit(s) for s in all_s]
        self._iter = [s for s, u in zip(all_s, units) if u == "iter"]
        self._epoch = [s for s, u in zip(all_s, units) if u == "epoch"]
        self._val = [s for s in all_s if s.need_val_args]
        wrappers = optim_wrappers_of(trainer.optim_wrapper)
        groups: dict[int, tuple[Any, list[Any]]] = {}
        for s, u in zip(all_s, units):
            if u == "update":
                ow = _wrapper_of(s, wrappers)
                groups.setdefault(id(ow), (ow, []))[1].append(s)
        self._update = list(groups.values())
        self._counts = [ow.inner_count for ow, _ in self._update]
        self._in_train = True
        self._log_units(trainer, all_s, units, wrappers)

    @staticmethod
    def _log_units(trainer: TrainerView, schedulers: list[Any], units: list[str], wrappers: dict[str, Any]) -> None:
        """One INFO line naming each schedule's unit, when iterations and updates differ (or a schedule counts
        updates)."""
        acc = max((ow.accumulative_counts for ow in wrappers.values()), default=1)
        if not schedulers or (acc == 1 and "update" not in units):
            return
        each = ", ".join(
            f"{getattr(s, 'name', type(s).__name__)} counts {UNIT_WORDS[u]}" for s, u in zip(schedulers, units)
        )
        trainer.logger.info(
            f"param_scheduler units (accumulative_counts={acc}: one optimizer update per {acc} iteration(s)): {each}. "
            "by_update=True counts a schedule in optimizer updates (see docs/schedulers.md)."
        )

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        self._in_train = False

    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        if self._in_train:
            for s in self._val:
                s.step(metrics or {})

    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        return (
            1 if self._iter or self._update else 0
        )  # only per-iteration and per-update schedulers step between epochs

    def before_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None) -> None:  # noqa: D102
        if self._update:
            self._counts = [ow.inner_count for ow, _ in self._update]

    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:  # noqa: D102
        for s in self._iter:
            s.step()
        for (ow, scheds), before in zip(self._update, self._counts):
            if ow.inner_count != before and ow.should_update():  # this iteration closed a window of this wrapper
                for s in scheds:
                    s.step()

    def after_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        for s in self._epoch:
            s.step()
