"""LoopContext: what the loops use in one run, handed to ``loop.run(ctx)``.

The Trainer builds one per ``train()`` / ``val()`` / ``test()`` after the model is prepared;
a test or a custom driver can build one by hand, without a Trainer. The loops read
nothing else: hooks are called with ``view``, and ``view.should_stop`` is the run's stop
flag (hooks set it; the loops read it after every step). ``control`` is the loop's
:class:`~trainwright.loops.control.RunControl`: stop and restart requests, settled by the
metric store's agreement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainwright.amp.precision import Precision
from trainwright.hooks.dispatch import HookList
from trainwright.hooks.view import TrainerView
from trainwright.logging.metric_store import MetricStore
from trainwright.loops.control import RunControl
from trainwright.utils.progress import Progress


@dataclass(eq=False)
class LoopContext:
    """The pieces of a run the loops use.

    Attributes:
        view: What every hook is called with (the Trainer); its ``should_stop`` is the stop flag.
        model: The model whose ``train_step`` / ``val_step`` / ``test_step`` the loops call.
        hooks: The hook list (events, and the per-iteration schedule).
        progress: The run's position; the train loop advances it.
        optim_wrapper: The OptimWrapper (or OptimWrapperDict) ``train_step`` gets; None outside training.
        metric_store: Records the step outputs; its ``agreement`` takes the stop / write decisions.
        validate: Runs one validation pass (the train loop calls it when due); None: no validation.
        precision: Its ``autocast()`` wraps an eval loop built with ``autocast=True``.
        logger: The run's logger.
        control: The run's stop / restart requests (default: one over ``metric_store.agreement``).
    """

    view: TrainerView
    model: Any
    hooks: HookList
    progress: Progress
    optim_wrapper: Any = None
    metric_store: MetricStore = field(default_factory=MetricStore)
    validate: Callable[[], Any] | None = None
    precision: Precision = field(default_factory=Precision)
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("trainwright"))
    control: RunControl = None  # type: ignore[assignment]  # built in __post_init__ over the metric store's agreement

    def __post_init__(self) -> None:
        if self.control is None:
            self.control = RunControl(self.metric_store.agreement)
