"""The learning-rate range test's settings (:class:`LRRange`) and their checks, importable without the test itself
(``Trainer.find_lr``'s defaults come from here)."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Accepted ``mode`` values: the exponential ramp (default) and the linear one.
MODES = {"exp": "exp", "exponential": "exp", "linear": "linear"}


def check_lr_args(min_lr: float, max_lr: float, num_steps: int, mode: str, smooth: float, diverge: float | None) -> str:
    """Check :func:`find_lr`'s arguments before anything is built; returns the mode's short name (``"exp"`` /
    ``"linear"``).

    Raises:
        ValueError: an argument out of range (the message names it and what is allowed).
    """
    if mode not in MODES:
        raise ValueError(f"find_lr mode must be 'exp' (exponential ramp) or 'linear', got {mode!r}")
    for name, value in (("min_lr", min_lr), ("max_lr", max_lr)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"find_lr {name} must be a finite number >= 0, got {value!r}")
    if MODES[mode] == "exp" and min_lr <= 0:
        raise ValueError(
            f"find_lr min_lr must be > 0 for the exponential ramp (it is multiplied up to max_lr), got {min_lr!r}; use "
            "e.g. min_lr=1e-6, or mode='linear'"
        )
    if min_lr >= max_lr:
        raise ValueError(
            f"find_lr needs min_lr < max_lr (the ramp goes from min_lr up to max_lr), got min_lr={min_lr!r}, "
            f"max_lr={max_lr!r}"
        )
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 2:
        raise ValueError(
            "find_lr num_steps must be an int >= 2 (the ramp needs its two ends; ~100 gives a usable curve), got "
            f"{num_steps!r}"
        )
    if isinstance(smooth, bool) or not isinstance(smooth, (int, float)) or not 0 < smooth <= 1:
        raise ValueError(
            "find_lr smooth must be in (0, 1] (the new loss's weight in the running average; 1: no smoothing), got "
            f"{smooth!r}"
        )
    if diverge is not None and (isinstance(diverge, bool) or not isinstance(diverge, (int, float)) or not diverge > 1):
        raise ValueError(
            "find_lr diverge must be a number > 1 (stop once the smoothed loss exceeds diverge x the best) or None "
            f"(never stop early), got {diverge!r}"
        )
    return MODES[mode]


@dataclass(frozen=True)
class LRRange:
    """The range test's settings and their one set of defaults (Lightning's ``lr_find``'s): :func:`find_lr`,
    ``Trainer.find_lr`` and :func:`trainwright.trainer.tuning_entry.find_lr` take them from here.

    Attributes:
        min_lr / max_lr: The ramp's first and last learning rate.
        num_steps: Updates of the test (>= 2).
        mode: ``"exp"`` (geometric ramp) or ``"linear"``.
        smooth: The new loss's weight in the running average (1: no smoothing).
        diverge: Stop once the smoothed loss exceeds ``diverge`` x its best (None: never early).
    """

    min_lr: float = 1e-6
    max_lr: float = 1.0
    num_steps: int = 100
    mode: str = "exp"
    smooth: float = 0.05
    diverge: float | None = 4.0

    def check(self) -> str:
        """:func:`check_lr_args` of these settings: the mode's short name, or a ValueError naming the bad one."""
        return check_lr_args(self.min_lr, self.max_lr, self.num_steps, self.mode, self.smooth, self.diverge)
