"""RuntimeInfoHook: mmengine's hook that keeps the message hub current; here only the evaluation metrics need it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register
class RuntimeInfoHook(Hook):
    """Writes each validation's and test's metrics into ``trainer.message_hub`` as scalars (``val/acc``).

    mmengine's hook also copies the epoch, the iteration and the training outputs into the hub
    at every iteration; trainwright's hub reads those from the run when asked (``get_info("iter")``,
    ``get_scalar("train/loss")``), so this hook does nothing per iteration.
    """

    priority = "VERY_HIGH"

    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102 - see Hook
        self._record(trainer, metrics)

    def after_test_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102 - see Hook
        self._record(trainer, metrics)

    @staticmethod
    def _record(trainer: TrainerView, metrics: dict[str, float] | None) -> None:
        for key, value in (metrics or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                trainer.message_hub.update_scalar(key, value)
