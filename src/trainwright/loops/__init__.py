"""Loops: train (by epoch or iteration), validation, test."""

from trainwright.loops.eval_loop import EvalLoop
from trainwright.utils.progress import Progress
from trainwright.loops.train_loop import EpochBasedTrainLoop, IterBasedTrainLoop

__all__ = ["Progress", "EpochBasedTrainLoop", "IterBasedTrainLoop", "EvalLoop"]
