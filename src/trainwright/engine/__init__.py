"""detectron2's engine API (``detectron2.engine``) as thin classes over trainwright's pieces.

A detectron2 training script written against ``SimpleTrainer`` / ``AMPTrainer`` / ``HookBase`` runs after changing
its imports (``from trainwright.engine import SimpleTrainer, HookBase, hooks``; docs/parity.md shows a whole script).
The scalars live in trainwright's :class:`~trainwright.logging.MetricStore` (through :class:`EventStorage`), metrics
are reduced with :mod:`trainwright.dist`, checkpoints are written with trainwright's atomic save. This is a separate,
small engine for ported code; trainwright's own :class:`~trainwright.Trainer` is not involved (docs/parity.md
compares them).
"""

from trainwright.engine import hooks
from trainwright.engine.checkpointer import Checkpointer
from trainwright.engine.events import EventStorage, History, get_event_storage
from trainwright.engine.train_loop import HookBase, TrainerBase
from trainwright.engine.trainers import AMPTrainer, SimpleTrainer
from trainwright.engine.writers import CommonMetricPrinter, EventWriter, JSONWriter

__all__ = [
    "AMPTrainer",
    "Checkpointer",
    "CommonMetricPrinter",
    "EventStorage",
    "EventWriter",
    "History",
    "HookBase",
    "JSONWriter",
    "SimpleTrainer",
    "TrainerBase",
    "get_event_storage",
    "hooks",
]
