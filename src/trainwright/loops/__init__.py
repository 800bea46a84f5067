"""Loops: train (by epoch or iteration), validation, test; each runs with a LoopContext."""

from trainwright.loops.context import LoopContext
from trainwright.loops.eval_loop import EvalLoop
from trainwright.utils.progress import Progress
from trainwright.loops.train_loop import EpochBasedTrainLoop, IterBasedTrainLoop

__all__ = ["LoopContext", "Progress", "EpochBasedTrainLoop", "IterBasedTrainLoop", "EvalLoop"]
