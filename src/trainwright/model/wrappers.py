"""Model wrappers that keep the step contract (``train_step`` / ``val_step`` / ``test_step``).

mmengine's ``MMDistributedDataParallel`` copies ``BaseModel.train_step`` with itself as the
forward callable. Here the model's own ``train_step`` runs: when the strategy wraps the
model it tells it that its training forward goes through the wrapper
(:meth:`~trainwright.BaseModel.set_forward_caller`), so DDP sees every forward and
synchronises gradients, and nothing is copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.nn.parallel import DistributedDataParallel


class DistributedDataParallelWrapper(DistributedDataParallel):
    """``DistributedDataParallel`` with the model's step methods.

    ``train_step`` is the wrapped model's (its forward in ``"loss"`` mode runs through this
    wrapper); ``val_step`` / ``test_step`` call the model itself, without gradient
    synchronisation, as in mmengine.
    """

    @property
    def train_step(self) -> Callable[[Any, Any], Any]:
        """The wrapped model's ``train_step`` (its forward goes through DDP)."""
        return self.module.train_step

    @property
    def val_step(self) -> Callable[[Any], Any]:
        """The wrapped model's ``val_step``."""
        return self.module.val_step

    @property
    def test_step(self) -> Callable[[Any], Any]:
        """The wrapped model's ``test_step``."""
        return self.module.test_step
