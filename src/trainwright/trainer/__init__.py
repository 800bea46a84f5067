"""The Trainer."""

from trainwright.trainer.trainer import Trainer

__all__ = ["Trainer"]
