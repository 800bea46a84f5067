"""NonFiniteLossError: the typed error of a NaN / Inf loss found at a metric-store flush.

The store raises it on every process at the same flush (the agreement makes the decision
common); it carries the iteration and the ranks, so the run's guard
(:class:`~trainwright.trainer.run_guard.RunGuard`) can add where the value came from (a replay,
:func:`trainwright.diagnose.explain_nonfinite`) without the store knowing the Trainer.
"""

from __future__ import annotations

__all__ = ["NonFiniteLossError"]


class NonFiniteLossError(FloatingPointError):
    """A loss logged since the last flush was NaN / Inf (``nonfinite_loss="raise"``).

    Args:
        iteration: The first iteration whose loss was non-finite on some process.
        ranks: The ranks whose loss was non-finite there (empty on one process).
        head: What was found (``"Loss became infinite or NaN at iteration 7: {...}."``).
        fixes: What to do about it.

    Attributes:
        explanation: Where the value came from, in words (set by whoever can find out; empty: not explained).
    """

    def __init__(self, iteration: int, ranks: tuple[int, ...], head: str, fixes: str) -> None:
        super().__init__(head, fixes)
        self.iteration = iteration
        self.ranks = ranks
        self.head = head
        self.fixes = fixes
        self.explanation = ""

    def __str__(self) -> str:
        return f"{self.head}{self.explanation} {self.fixes}"

    def __reduce__(self) -> tuple:  # pickled whole (e.g. a failure left for the other ranks), explanation included
        return (_rebuild, (self.iteration, self.ranks, self.head, self.fixes, self.explanation))


def _rebuild(iteration: int, ranks: tuple[int, ...], head: str, fixes: str, explanation: str) -> NonFiniteLossError:
    e = NonFiniteLossError(iteration, ranks, head, fixes)
    e.explanation = explanation
    return e
