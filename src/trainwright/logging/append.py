"""AppendFile: a log file appended to whole lines at a time, holding no descriptor, never breaking training.

``train.log`` and ``metrics.jsonl`` go through it: no torn lines (a failed flush truncates the
file back to its size before it), and a failed flush (full disk, quota) drops its lines with a
warning naming the path while training goes on.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path


class AppendFile:
    """Text appended to ``path`` in whole flushes: all of it or none of it.

    * **No torn lines.** One ``os.write`` per flush (looping on short writes); a failed flush
      truncates the file back to its size before it.
    * **Failures warn, training goes on.** The lines of a failed flush (full disk, quota) are
      dropped with a warning naming the path; the next good flush says how many were lost.
    * **No descriptor held.** Opened, appended and closed per flush.

    Args:
        path: The file; created (with its parent folders) at the first flush.
        what: What the file holds, for the warning (``"log lines"``, ``"metric records"``).
    """

    def __init__(self, path: str | os.PathLike[str], what: str = "lines") -> None:
        self.path = Path(path)
        self.what = what
        self._buf: list[str] = []
        self.lost = 0  # lines dropped since the last successful flush

    def write(self, text: str) -> None:
        """Queue ``text`` (whole lines ending in a newline) for the next :meth:`flush`."""
        self._buf.append(text)

    @property
    def pending(self) -> bool:
        """True when text is waiting for a flush."""
        return bool(self._buf)

    def flush(self) -> bool:
        """Append the queued text; on failure truncate back, warn with the path, drop it.

        Returns:
            True if the text reached the file (or nothing was queued).
        """
        if not self._buf:
            return True
        data = "".join(self._buf).encode("utf-8")
        self._buf = []
        try:
            self._append(data)
        except OSError as e:
            n = data.count(b"\n")
            first = self.lost == 0
            self.lost += n
            if first:
                warnings.warn(
                    f"Could not write {n} {self.what} to {str(self.path)!r}: {e.strerror or e}. They are lost; "
                    "training goes on, and "
                    "this file gets whole lines again once writing works (free space on its disk, or check its "
                    "permissions).",
                    stacklevel=2,
                )
            return False
        if self.lost:
            warnings.warn(
                f"Writing to {str(self.path)!r} works again; {self.lost} {self.what} written meanwhile are missing "
                "from it.",
                stacklevel=2,
            )
            self.lost = 0
        return True

    def _append(self, data: bytes) -> None:
        if not self.path.parent.is_dir():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                try:
                    os.ftruncate(fd, size)  # no torn line: back to the last complete flush
                except OSError:
                    pass
                raise
        finally:
            os.close(fd)
