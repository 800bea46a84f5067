"""``Progress`` lives in :mod:`trainwright.utils.progress` (a low layer, so hooks can be typed against it); kept here for imports."""

from trainwright.utils.progress import Progress

__all__ = ["Progress"]
