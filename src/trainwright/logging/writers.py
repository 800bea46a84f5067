"""Writers: where logged scalars go (JSON lines now; TensorBoard, CSV, W&B later)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any



_encode_strict = json.JSONEncoder(allow_nan=False).encode


def _encode(record: dict[str, Any]) -> str:
    try:
        return _encode_strict(record)
    except ValueError:  # a NaN / Inf value
        return _encode_strict(_finite(record))


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with non-finite floats as strings ("nan", "inf"): JSON has no such numbers."""
    for v in record.values():
        if isinstance(v, float) and not math.isfinite(v):
            return {k: (str(x) if isinstance(x, float) and not math.isfinite(x) else x) for k, x in record.items()}
    return record


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
        self.write_many([record])

    def write_many(self, records: list[dict[str, Any]]) -> None:
        """Append several records with one write."""
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
        self._fh.write("".join([_encode(r) + "\n" for r in records]))
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
