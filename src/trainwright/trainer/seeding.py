"""The run's seed: what the Trainer seeded with, whether the user named it, and adopting a resumed checkpoint's."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainwright.strategies.base import Strategy


def torch_seeded() -> bool:
    """Whether torch's default generator was seeded in this process.

    A seed someone set (``tw.seed_everything``, ``torch.manual_seed``) is below 2**32 in
    practice; the one torch draws at start-up is a random 64-bit number.
    """
    return torch.initial_seed() < 2**32


class RunSeed:
    """The seed of a run: the strategy's (it seeded every RNG), named by the user or drawn.

    A run that named no seed adopts a resumed checkpoint's (:meth:`adopt`): its data order
    continues the checkpoint's (mmengine's semantics); the random streams come from the
    checkpoint itself.

    Args:
        strategy: The strategy that seeded the process (``strategy.seed``).
        given: Whether ``randomness`` named the seed.
        config: The trainer's plain settings, whose ``"seed"`` follows an adopted seed.
        logger: Where the adoption is noted.
    """

    def __init__(self, strategy: Strategy, given: bool, config: dict[str, Any], logger: logging.Logger) -> None:
        self._strategy = strategy
        #: True when ``randomness`` named the seed: a resumed checkpoint's is then not adopted.
        self.given = given
        self._config = config
        self._logger = logger
        self._loader: Any = None

    @property
    def value(self) -> int:
        """The seed in use."""
        return int(self._strategy.seed or 0)

    def follow(self, loader: Any) -> None:
        """Make ``loader`` (the train loader, with ``set_seed``) take an adopted seed; None: no loader."""
        self._loader = loader

    def adopt(self, seed: int) -> None:
        """Use ``seed`` (a checkpoint's, when the run gave none) for the data order."""
        self._logger.info(
            f"Adopted the checkpoint's random seed {seed} (this run gave no seed, so it had drawn {self.value})"
        )
        self._strategy.seed = seed
        self._config["seed"] = seed
        if self._loader is not None:
            self._loader.set_seed(seed)

    def note_model_seeding(self, built_unseeded: bool, load_from: str | Path | None) -> None:
        """Log that a model built before the Trainer seeded came from an unseeded generator (its weights differ per
        run)."""
        if built_unseeded and self.given and load_from is None:
            seed = self.value
            self._logger.info(
                f"The model was built before the Trainer seeded torch with seed {seed}, and torch had not been seeded "
                "in "
                "this process: its initial weights come from an unseeded generator, so two runs of this script start "
                "from "
                "different weights (unless they are loaded, e.g. resumed). To make them follow the seed, build the "
                "model "
                f"after tw.seed_everything({seed}), or pass model=dict(type=...) (a class in "
                "trainwright.registry.MODELS), "
                "which the Trainer builds after seeding."
            )
