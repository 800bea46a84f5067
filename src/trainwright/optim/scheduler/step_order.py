"""Misuse warnings for hand-written loops, as torch and mmengine give them.

Two mistakes make a schedule silently wrong: ``scheduler.step()`` before the first
``optimizer.step()``, and replacing ``optimizer.step`` after the scheduler was built. A
:class:`StepOrderWatch` registers one step post-hook on the torch optimizer; the check runs
once, at the scheduler's first :meth:`~ParamScheduler.step`, and removes the hook. The
param-scheduler hook turns the check off before training (the trainer orders the calls, and
may step a scheduler before the first real optimizer step: accumulation, a skipped fp16 step).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

#: Where torch's and mmengine's warnings send the reader.
DOCS_URL = "https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate"
BEFORE_OPTIMIZER = (
    "Detected call of `{name}.step()` before `optimizer.step()`: {name}.step() was called before the first "
    "optimizer.step(). "
    "In PyTorch 1.1.0 and later, you should call them in the opposite order: `optimizer.step()` before "
    "`{name}.step()`. "
    "Failure to do this will result in PyTorch skipping the first value of the parameter value schedule (step 0). "
    "Call optimizer.step() first and scheduler.step() after it (the Trainer does this for you). See more details at "
    + DOCS_URL
)
STEP_REPLACED = (
    "Seems like `optimizer.step()` has been overridden after {name} initialization: optimizer.step was replaced after "
    "{name} was built, "
    "so the scheduler cannot check that optimizer.step() runs before scheduler.step(). Please, make sure to call "
    "`optimizer.step()` "
    "before `{name}.step()`, and replace optimizer.step before building the scheduler. See more details at " + DOCS_URL
)


class StepOrderWatch:
    """Records whether a torch optimizer has stepped, until :meth:`close` (one step post-hook).

    Args:
        optimizer: A ``torch.optim.Optimizer``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = weakref.ref(optimizer)
        # An instance-level `step` (if any) at build time: another one later means it was replaced.
        self._step_attr = optimizer.__dict__.get("step")
        self.stepped = False
        self._handle: Any = optimizer.register_step_post_hook(self._on_step)

    @classmethod
    def attach(cls, optimizer: Any) -> StepOrderWatch | None:
        """Watch ``optimizer`` (or an optim wrapper's ``.optimizer``); None when it is no torch optimizer."""
        inner = getattr(optimizer, "optimizer", optimizer)
        return cls(inner) if isinstance(inner, torch.optim.Optimizer) else None

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.stepped = True

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        """A deep-copied scheduler is not watched: its copy of the optimizer carries no hook."""
        return None

    def close(self) -> None:
        """Remove the post-hook (idempotent)."""
        self._handle.remove()

    def problem(self, name: str) -> str | None:
        """The misuse to warn about when the scheduler ``name`` steps for the first time, or None."""
        optimizer = self._optimizer()
        if optimizer is None:
            return None
        if optimizer.__dict__.get("step") is not self._step_attr:
            return STEP_REPLACED.format(name=name)
        if not self.stepped:
            return BEFORE_OPTIMIZER.format(name=name)
        return None


__all__ = ["StepOrderWatch"]
