"""Find a monitored metric in a validation's results, by its key or its ``val/``-prefixed key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The prefix the validation loop puts on metric keys; a monitor without it is looked up with it too.
VAL_PREFIX = "val/"


def metric_key(metric: str, metrics: Mapping[str, Any]) -> str | None:
    """The key of ``metric`` in ``metrics``: itself, or ``val/<metric>`` (an mmengine config names the evaluator's
    key); None if absent."""
    return next((k for k in (metric, VAL_PREFIX + metric) if k in metrics), None)
