"""SpikeGuardHook: the run-level half of the loss-spike guard (its log line and counter, rollbacks).

The :class:`~trainwright.optim.spike_guard.SpikeGuard` decides inside the optim wrapper's
update whether a loss is a spike (its window is not stepped). This hook, built by the trainer
for ``Trainer(spike_guard=...)``, logs each spike and records ``spike_skipped`` in the log
records; with ``action="rollback"`` it keeps the checkpoint to go back to (in memory every
``capture_every`` iterations, else the latest one on disk), puts the run back there after a
spike and has the loop go on from there, the updates up to the spike skipped. See docs/diagnose.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.optim.spike_guard import SpikeGuard

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


class SpikeRollbackError(RuntimeError):
    """The spike guard rolled back ``max_rollbacks`` times and met another spike (raised on every rank at the same
    iteration)."""

    #: The guard's decision is the same on every rank: the ranks stay together.
    raised_on_every_rank = True


class SpikeGuardHook(Hook):
    """Logs the guard's spikes, counts them in the records and carries out ``action="rollback"``.

    Args:
        guard: The optim wrapper's guard.
    """

    priority = "LOWEST"  # a rollback comes after every other hook of the spike's iteration (its checkpoint included)

    def __init__(self, guard: SpikeGuard) -> None:
        self.guard = guard
        self._captured: dict[str, Any] | None = None  # the in-memory checkpoint (capture_every)
        self._captured_at = -1

    # -- set-up -------------------------------------------------------------------------------
    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        g = self.guard
        if g.action == "rollback" and g.capture_every is not None:
            self._capture(trainer)

    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        return 1 if self.guard.action == "rollback" else 0

    def _capture(self, trainer: TrainerView) -> None:
        self._captured = trainer.checkpoints.capture()
        self._captured_at = trainer.progress.iteration

    # -- rollback -----------------------------------------------------------------------------
    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:  # noqa: D102
        g, it = self.guard, trainer.progress.iteration
        if g.last is not None and g.last[0] == it:
            self._roll_back(trainer, it)
        elif g.capture_every is not None and it % g.capture_every == 0:
            self._capture(trainer)

    def _roll_back(self, trainer: TrainerView, k: int) -> None:
        g = self.guard
        assert g.last is not None
        _, loss, med, limit = g.last
        rollbacks, skipped = (
            g.rollbacks,
            g.skipped,
        )  # a restore puts back the guard's counters of the restored iteration
        if rollbacks >= g.max_rollbacks and self._captured is not None:
            raise self._spent(k, loss, med, limit)
        if self._captured is not None:
            trainer.checkpoints.restore_captured(self._captured)
            source = f"the in-memory checkpoint of iteration {self._captured_at}"
        else:
            strategy = trainer.strategy
            # a save still written in the background (async_save) is the latest one: finish it first
            strategy.wait_for_checkpoint()
            if strategy.world_size > 1:
                # rank 0 put it in place and wrote `latest`: every rank lists it before they agree on the newest
                strategy.barrier()
            found = trainer.checkpoints.find_and_restore()
            if found is None:
                raise RuntimeError(
                    f"Loss spike at iteration {k}: spike_guard action='rollback' found no checkpoint in "
                    f"{trainer.checkpoints.ckpt_dir} to roll back to "
                    "(none was saved yet). Save earlier (a smaller CheckpointHook interval), keep one in memory with "
                    "capture_every=N, or use action='skip'."
                )
            source = str(found[0])
        if (
            trainer.progress.iteration == k
        ):  # the newest checkpoint is the spike's own, written after its update was skipped
            g.restored(rollbacks, skipped)
            trainer.logger.warning(
                f"spike_guard: the newest checkpoint ({source}) is of the spike's own iteration {k}, written after its "
                "update was skipped: "
                "nothing to run again, no rollback spent; training goes on (save less often than every spike, or use "
                "capture_every=N, to go further back)"
            )
            return
        if rollbacks >= g.max_rollbacks:
            raise self._spent(k, loss, med, limit)
        rollbacks += 1
        s = trainer.progress.iteration
        g.restored(rollbacks, skipped, skip_through=k)  # the restore put back the guard's state of iteration s
        trainer.logger.warning(
            f"spike_guard rolled back to iteration {s} ({source}) after the loss spike at iteration {k}: iterations "
            f"{s + 1}..{k} run again without "
            f"updates (their batches skipped), training goes on from iteration {k + 1} (rollback {rollbacks} of at "
            f"most {g.max_rollbacks})"
        )
        require_train_loop(trainer, "spike_guard's rollback").restart_from(
            s
        )  # decided on every rank: the loop leaves its pass and goes on from s

    def _spent(self, k: int, loss: float, med: float, limit: float) -> SpikeRollbackError:
        g = self.guard
        return SpikeRollbackError(
            f"Loss spike at iteration {k} (loss {loss:.6g} > {limit:.6g}, median {med:.6g}) after {g.max_rollbacks} "
            "rollback(s): spike_guard "
            f"max_rollbacks={g.max_rollbacks} is spent. The run is unstable at this point: lower the learning rate, "
            "raise the warm-up, "
            "enable gradient clipping or check the data around these iterations; or raise max_rollbacks / threshold."
        )

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The guard's recent losses and counters (an exact resume judges the next loss as the uninterrupted run
        would)."""
        return self.guard.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.guard.load_state_dict(state)
