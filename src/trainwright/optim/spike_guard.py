"""SpikeGuard: skip the update (or roll back) when the loss jumps far above its recent median.

A loss is a spike when it exceeds the median of the last ``window`` losses by more than
``threshold`` robust deviations (1.4826 x the median absolute deviation, MAD). The optim
wrapper asks the guard once per micro-batch, before back-propagating; a spike's whole
accumulation window is not stepped. See docs/diagnose.md.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from trainwright.registry import check_keys

if TYPE_CHECKING:
    import logging

    from trainwright.logging.metric_store import MetricStore
    from trainwright.utils.progress import Progress

__all__ = ["SPIKE_GUARD_KEYS", "SpikeGuard"]

#: Keys ``spike_guard=dict(...)`` accepts.
SPIKE_GUARD_KEYS = frozenset({"window", "threshold", "action", "max_rollbacks", "min_history", "capture_every"})
#: ``gather(t)``: every process's 1-D float64 tensor stacked in rank order, ``[world, n]`` (``Strategy.all_gather``).
Gather = Callable[[torch.Tensor], torch.Tensor]
_MAD_TO_STD = 1.4826  # a normal distribution's standard deviation in MADs


class SpikeGuard:
    """Judges each loss against the running median of the recent ones; keeps what a resume needs.

    Args:
        window: How many recent losses the median and the MAD are taken over.
        threshold: A loss above ``median + threshold * 1.4826 * MAD`` is a spike.
        action: ``"skip"`` (no optimizer step for the spike's accumulation window) or
            ``"rollback"`` (that, and the :class:`~trainwright.hooks.spike_guard.SpikeGuardHook`
            puts the run back at its last checkpoint, skipping the batches from there to the spike).
        max_rollbacks: ``"rollback"``: more spikes than this stop the run with an error.
        min_history: Losses seen before any is judged (default: ``min(window, 20)``).
        capture_every: ``"rollback"``: keep an in-memory checkpoint every this many
            iterations (and at the start) to roll back to; None: roll back to the latest
            checkpoint on disk (the :class:`~trainwright.hooks.CheckpointHook`'s).
        progress: The run's position (the judged loss belongs to ``progress.iteration + 1``);
            None: iteration 0 until :meth:`attach` gives one.
        logger: Where each spike is logged (a warning); None: not logged.
        metric_store: Records ``spike_skipped`` at every judged step (every log record
            carries the count); None: not recorded.
        gather: Under several processes ``Strategy.all_gather`` (every rank judges the largest
            loss over the ranks); None: one process.

    The Trainer builds the guard from ``Trainer(spike_guard=dict(...))`` before the run's
    pieces exist, and gives it ``progress``, ``logger``, ``metric_store`` and ``gather`` through
    :meth:`attach`.

    Attributes:
        skipped: Updates skipped for a spike so far (in every record as ``spike_skipped``).
        rollbacks: Rollbacks so far.
        skip_through: Updates of iterations up to this one are skipped (a rollback's window).
        last: ``(iteration, loss, median, limit)`` of the last spike, or None.
    """

    def __init__(
        self,
        window: int = 200,
        threshold: float = 6.0,
        action: str = "skip",
        max_rollbacks: int = 3,
        min_history: int | None = None,
        capture_every: int | None = None,
        *,
        progress: Progress | None = None,
        logger: logging.Logger | None = None,
        metric_store: MetricStore | None = None,
        gather: Gather | None = None,
    ) -> None:
        if not isinstance(window, int) or isinstance(window, bool) or window < 3:
            raise ValueError(
                f"spike_guard window must be an int >= 3 (losses the running median is taken over), got {window!r}"
            )
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold > 0:
            raise ValueError(
                f"spike_guard threshold must be a number > 0 (robust deviations above the median), got {threshold!r}"
            )
        if action not in ("skip", "rollback"):
            raise ValueError(f"spike_guard action must be 'skip' or 'rollback', got {action!r}")
        if not isinstance(max_rollbacks, int) or isinstance(max_rollbacks, bool) or max_rollbacks < 0:
            raise ValueError(f"spike_guard max_rollbacks must be an int >= 0, got {max_rollbacks!r}")
        if min_history is None:
            min_history = min(window, 20)
        if not isinstance(min_history, int) or not 3 <= min_history <= window:
            raise ValueError(f"spike_guard min_history must be an int in [3, window={window}], got {min_history!r}")
        if capture_every is not None and (
            not isinstance(capture_every, int) or isinstance(capture_every, bool) or capture_every < 1
        ):
            raise ValueError(
                "spike_guard capture_every must be an int >= 1 (iterations between in-memory checkpoints) or None, "
                f"got {capture_every!r}"
            )
        if capture_every is not None and action != "rollback":
            raise ValueError(
                "spike_guard capture_every applies to action='rollback' only (it keeps the checkpoint to roll back "
                "to); drop it, or set action='rollback'"
            )
        self.window, self.threshold, self.action = window, float(threshold), action
        self.max_rollbacks, self.min_history, self.capture_every = max_rollbacks, min_history, capture_every
        self.losses: deque[float] = deque(maxlen=window)
        self.skipped = 0
        self.rollbacks = 0
        self.skip_through = 0
        self.last: tuple[int, float, float, float] | None = None
        self.progress: Progress | None = None
        self.logger: logging.Logger | None = None
        self.metric_store: MetricStore | None = None
        self.gather: Gather | None = None
        self.attach(progress=progress, logger=logger, metric_store=metric_store, gather=gather)

    def attach(
        self,
        *,
        progress: Progress | None = None,
        logger: logging.Logger | None = None,
        metric_store: MetricStore | None = None,
        gather: Gather | None = None,
    ) -> None:
        """Give the guard the run it judges (each argument given replaces the guard's own; see the class's arguments).

        The Trainer calls it once it has built these (the guard was built from the config first).
        """
        if progress is not None:
            self.progress = progress
        if logger is not None:
            self.logger = logger
        if metric_store is not None:
            self.metric_store = metric_store
        if gather is not None:
            self.gather = gather

    #: Decides for a micro-batch's whole accumulation window (an :class:`~trainwright.optim.update_guard.UpdateGuard`).
    skips_window = True

    def _count(self, it: int) -> None:
        if self.metric_store is not None:
            self.metric_store.update_scalar(
                "spike_skipped", self.skipped, it
            )  # a list append per step: every record carries the count

    @classmethod
    def build(cls, cfg: SpikeGuard | Mapping[str, Any] | None) -> SpikeGuard | None:
        """A guard from ``Trainer(spike_guard=...)``: None, a SpikeGuard or a dict of its arguments.

        Raises:
            ConfigError: an unknown key (naming the closest one).
        """
        from trainwright.registry import ConfigError

        if cfg is None or isinstance(cfg, SpikeGuard):
            return cfg
        if not isinstance(cfg, Mapping):
            raise TypeError(
                "spike_guard must be a dict like dict(window=200, threshold=6.0, action='skip'), got "
                f"{type(cfg).__name__}"
            )
        check_keys("spike_guard", cfg, SPIKE_GUARD_KEYS, ConfigError)
        return cls(**cfg)

    # -- the per-step decision -------------------------------------------------------------
    def limit(self) -> float:
        """The loss above which the next one is a spike (inf until ``min_history`` losses were seen)."""
        if len(self.losses) < self.min_history:
            return math.inf
        values = sorted(self.losses)
        med = _median(values)
        mad = _median(sorted(abs(v - med) for v in values))
        return med + self.threshold * _MAD_TO_STD * mad

    def check(self, loss: torch.Tensor) -> bool:
        """Whether the update of ``loss``'s window is skipped: a spike, or inside a rollback's window (the same answer
        on every rank).

        Asked by the optim wrapper once per micro-batch, before back-propagating. One host read
        of ``loss`` (and under several processes one all-gather of one number, so every rank
        judges the same value: the largest loss over the ranks).
        A non-finite loss is neither judged nor remembered (``nonfinite_loss`` decides about it).
        """
        it = 0 if self.progress is None else self.progress.iteration + 1
        self._count(it)
        if it <= self.skip_through:
            return True
        value = float(loss.detach().float().mean())
        if self.gather is not None:
            value = float(self.gather(torch.tensor([value], dtype=torch.float64)).max())
        if not math.isfinite(value):
            return False
        limit = self.limit()
        if value > limit:
            med = _median(sorted(self.losses))
            self.last = (it, value, med, limit)
            self.skipped += 1
            self._count(it)
            self._log(
                f"Loss spike at iteration {it}: loss {value:.6g} > {limit:.6g} (median {med:.6g} + {self.threshold:g} "
                "robust deviations "
                f"over the last {len(self.losses)} losses): "
                + (
                    "its update is skipped"
                    if self.action == "skip"
                    else "rolling back"
                    if self.rollbacks < self.max_rollbacks
                    else "no rollback left"
                )
                + f" (spike_guard; {self.skipped} skipped so far)"
            )
            return True
        self.losses.append(value)
        return False

    def restored(self, rollbacks: int, skipped: int, skip_through: int | None = None) -> None:
        """The run was just put back at an earlier checkpoint, which restored this guard's state of that iteration.

        Keeps the counters of the run so far (``rollbacks``, ``skipped``: a rollback is not
        undone by the restore it made) and forgets the spike; ``skip_through``: the updates of
        iterations up to it are skipped (the rollback's window), None: unchanged.
        """
        self.rollbacks, self.skipped, self.last = rollbacks, skipped, None
        if skip_through is not None:
            self.skip_through = skip_through

    def _log(self, message: str) -> None:
        if self.logger is not None:
            self.logger.warning(message)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The recent losses and the counters: a resumed run judges the next loss as the uninterrupted one would."""
        return {
            "losses": list(self.losses),
            "skipped": self.skipped,
            "rollbacks": self.rollbacks,
            "skip_through": self.skip_through,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.losses = deque((float(v) for v in state.get("losses", [])), maxlen=self.window)
        self.skipped = int(state.get("skipped", 0))
        self.rollbacks = int(state.get("rollbacks", 0))
        self.skip_through = int(state.get("skip_through", 0))

    def __repr__(self) -> str:
        return (
            f"SpikeGuard(window={self.window}, threshold={self.threshold:g}, action={self.action!r}, "
            f"max_rollbacks={self.max_rollbacks})"
        )


def _median(values: list[float]) -> float:
    n = len(values)
    return values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])
