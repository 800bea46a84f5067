"""Writers: where logged scalars go (JSON lines now; TensorBoard, CSV, W&B later)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any



class JsonlWriter:
    """Appends one JSON object per line to ``path`` (``metrics.jsonl``); opened lazily.

    Lines reach the OS at most ``flush_secs`` after they are written (and always on
    :meth:`flush` / :meth:`close`), so logging does not pay a system call per record.
    """

    def __init__(self, path: str | Path, flush_secs: float = 1.0) -> None:
        self.path = Path(path)
        self.flush_secs = flush_secs
        self._fh: Any = None
        self._last_flush = 0.0

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (non-finite floats written as strings "nan"/"inf")."""
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
        for k, v in record.items():
            if isinstance(v, float) and not math.isfinite(v):
                record = {k2: (str(v2) if isinstance(v2, float) and not math.isfinite(v2) else v2) for k2, v2 in record.items()}
                break
        self._fh.write(json.dumps(record) + "\n")
        now = time.monotonic()
        if now - self._last_flush >= self.flush_secs:
            self._fh.flush()
            self._last_flush = now

    def flush(self) -> None:
        """Push buffered lines to the OS."""
        if self._fh is not None:
            self._fh.flush()
            self._last_flush = time.monotonic()

    def close(self) -> None:
        """Close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
