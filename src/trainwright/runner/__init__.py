"""mmengine's ``mmengine.runner`` import path: ``Runner`` with mmengine's keyword arguments, over
:class:`trainwright.Trainer`."""

from __future__ import annotations

from trainwright.runner.runner import Runner

__all__ = ["Runner"]
