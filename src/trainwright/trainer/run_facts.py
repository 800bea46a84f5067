"""The run's facts that mmengine's message hub reads live (``message_hub.get_info("iter")``), from the objects that
hold them; the Trainer's message hub over them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainwright.logging.message_hub import MessageHub

if TYPE_CHECKING:
    from trainwright.logging.metric_store import MetricStore
    from trainwright.trainer.seeding import RunSeed
    from trainwright.utils.progress import Progress


def run_facts(
    progress: Progress, seed: RunSeed, experiment_name: str, train_loop: Callable[[], Any]
) -> dict[str, Callable[[], Any]]:
    """``epoch``, ``iter``, ``max_iters``, ``max_epochs``, ``experiment_name`` and ``seed``, each read when asked.

    Args:
        progress: The run's position.
        seed: The run's seed (a resumed run may adopt its checkpoint's).
        experiment_name: The run's name.
        train_loop: Returns the train loop, or None before one is built (then ``max_iters`` and ``max_epochs`` are 0).
    """

    def max_iters() -> int:
        loop = train_loop()
        return loop.max_iters if loop is not None else 0

    def max_epochs() -> int:
        loop = train_loop()
        return getattr(loop, "max_epochs", 1 if loop is not None else 0)

    return {
        "epoch": lambda: progress.epoch,
        "iter": lambda: progress.iteration,
        "max_iters": max_iters,
        "max_epochs": max_epochs,
        "experiment_name": lambda: experiment_name,
        "seed": lambda: seed.value,
    }


def message_hub(
    name: str, progress: Progress, seed: RunSeed, train_loop: Callable[[], Any], metric_store: MetricStore
) -> MessageHub:
    """The run's message hub (mmengine's, named ``name``): the run's facts read live (:func:`run_facts`), the logged
    scalars read from ``metric_store``, and what hooks and models write."""
    return MessageHub(
        name,
        live=run_facts(progress, seed, name, train_loop),
        scalars=lambda key: metric_store.get(key) if key in metric_store else None,
    )
