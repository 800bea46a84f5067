"""Loop counters: the one small object that says where training stands."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Progress:
    """Where a run stands: checkpointed as a whole, restored as a whole.

    The one record of the position: on resume the train loader is positioned from
    ``(epoch, iter_in_epoch)`` and the optim wrapper's accumulation window from
    ``iter_in_epoch`` / ``iteration``; neither saves a position of its own in a checkpoint.

    Attributes:
        epoch: Completed training epochs (the epoch in progress is ``epoch``, 0-based).
        iteration: Completed training iterations (optimizer micro-steps) over the whole run.
        iter_in_epoch: Completed iterations inside the current epoch; a checkpoint taken
            mid-epoch resumes from here without replaying the data loader.
        val_owed: The validation due after the last completed epoch (iteration-based: iteration) has not run to its
            end yet (a stop came first): a run resumed here runs it before training on. Saved only when True.
    """

    epoch: int = 0
    iteration: int = 0
    iter_in_epoch: int = 0
    val_owed: bool = False

    def where(self, by_epoch: bool = True) -> str:
        """Where the run stands, numbered as its log lines: ``"at epoch E, iteration N"`` (E from 1; between epochs
        the one just completed), or ``"at iteration N"``."""
        if not by_epoch:
            return f"at iteration {self.iteration}"
        epoch = self.epoch + 1 if self.iter_in_epoch or not self.epoch else self.epoch
        return f"at epoch {epoch}, iteration {self.iteration}"

    def state_dict(self) -> dict[str, Any]:
        """Return the counters as a plain dict (``val_owed`` only when a validation is owed)."""
        state = asdict(self)
        if not self.val_owed:
            del state["val_owed"]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters saved by :meth:`state_dict`."""
        self.epoch = int(state["epoch"])
        self.iteration = int(state["iteration"])
        self.iter_in_epoch = int(state["iter_in_epoch"])
        self.val_owed = bool(state.get("val_owed", False))
