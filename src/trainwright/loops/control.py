"""RunControl: the requests that end a train loop's pass over the data, owned by the loop.

Two kinds of request, each explicit and settled on every rank at the same iteration: a stop (early stopping, a
preemption, a time limit) and a restart from an earlier position that a hook has just restored (the spike guard's
rollback). The loop asks which one ended its pass, so it never has to guess a restart from a stop.
"""

from __future__ import annotations

from trainwright.logging.agreement import Agreement

__all__ = ["RunControl"]


class RunControl:
    """Stop and restart requests of one training run, settled at the agreement's points.

    A :meth:`request_stop` made on one rank is settled by the run's :class:`~trainwright.logging.agreement.Agreement`
    at its next agreement point, so every rank stops after the same iteration; one already taken on every rank
    together is decided at once (``agreed=True``). :meth:`restart_from` is called on every rank at the same iteration.
    The loop reads one field per iteration (``view.should_stop``: the agreement's ``finish``); when it leaves a pass it
    asks :meth:`take_restart` whether that was a restart.

    Args:
        agreement: Where the requests are settled (the run's metric store's).

    Attributes:
        agreement: See above.
        stop_reason: Why the first stop request of the run was made (None: none yet).
        preempted: A preemption (a stop signal) ended the run: ``request_stop(..., preemption=True)``.
        restart_at: The iteration the loop goes on from after the current one (None: no restart pending).
    """

    def __init__(self, agreement: Agreement) -> None:
        self.agreement = agreement
        self.stop_reason: str | None = None
        self.restart_at: int | None = None
        self.preempted = False
        self._stop_agreed = (
            False  # a stop decided on every rank at once (request_stop(agreed=True)): no restart overrides it
        )

    def reset(self) -> None:
        """Forget the requests (a new run)."""
        self.stop_reason = None
        self.restart_at = None
        self.preempted = False
        self._stop_agreed = False

    def request_stop(self, reason: str, *, agreed: bool = False, preemption: bool = False) -> None:
        """End training after the current iteration (several processes: at the next agreement point, on every rank
        together).

        Args:
            reason: Why, in words (kept in :attr:`stop_reason`; the first request's is kept).
            agreed: The decision was taken on every rank at this same point (a preemption agreed
                at its own check): it takes effect at once, without waiting for an agreement point.
            preemption: The stop is a preemption's (the preemption hook's): :attr:`preempted` becomes True.
        """
        self.preempted = self.preempted or preemption
        if self.stop_reason is None:
            self.stop_reason = reason
        if agreed:
            self._stop_agreed = True
            self.agreement.set_finish(True)
        else:
            self.agreement.request_finish(True)

    def restart_from(self, iteration: int) -> None:
        """Go on from ``iteration`` after the current one's hooks: a hook has just restored the run's state there.

        Call it on every rank at the same iteration (the spike guard's decision is agreed): the
        loop leaves its pass over the data at once, rebuilds the hooks' schedule from
        ``iteration`` and iterates the loader from its restored position.

        Raises:
            ValueError: ``iteration`` is negative.
        """
        if not isinstance(iteration, int) or iteration < 0:
            raise ValueError(
                f"restart_from needs the iteration the run was restored to (an int >= 0), got {iteration!r}"
            )
        self.restart_at = iteration
        self.agreement.set_finish(True)  # taken on every rank at this iteration: leave the pass now

    def take_restart(self) -> int | None:
        """The loop left its pass: the iteration to go on from if that was a restart, else None (a stop).

        A stop agreed meanwhile (a preemption) wins over the restart. A restart taken clears the
        stop it used to leave the pass (decided on every rank: so is going on).
        """
        at, self.restart_at = self.restart_at, None
        if at is None or self.agreement.stop or self._stop_agreed:
            return None
        self.agreement.set_finish(False)
        return at
