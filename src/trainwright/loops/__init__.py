"""Loops: train (by epoch or iteration), validation, test; each runs with a LoopContext."""

from trainwright.loops.context import LoopContext
from trainwright.loops.eval_loop import EvalLoop
from trainwright.loops.train_loop import EpochBasedTrainLoop, IterBasedTrainLoop
from trainwright.utils.progress import Progress

__all__ = ["LoopContext", "Progress", "EpochBasedTrainLoop", "IterBasedTrainLoop", "EvalLoop"]
