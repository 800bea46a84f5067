"""Writers: where logged scalars go (JSON lines now; TensorBoard, CSV, W&B later)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class JsonlWriter:
    """Appends one JSON object per line to ``path`` (``metrics.jsonl``); opened lazily."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: Any = None

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (non-finite floats written as strings "nan"/"inf")."""
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
        clean = {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._fh.write(json.dumps(clean) + "\n")
        self._fh.flush()

    def close(self) -> None:
        """Close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
