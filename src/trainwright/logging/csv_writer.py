"""``CsvWriter``: one CSV file per mode (``train.csv``, ``val.csv``, ``test.csv``) in the run folder's ``csv/``."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

from trainwright.logging.resume import Resumed, replace_text
from trainwright.logging.writers import LineInfo, Writer


class CsvWriter(Writer):
    """Writes training records to ``<dir>/train.csv`` and evaluation records to ``<dir>/val.csv`` / ``<dir>/test.csv``.

    Each row is one record (the same dict as a line of ``metrics.jsonl``); the columns are the
    keys seen so far, in order of first appearance. When a record brings a new key (e.g.
    ``loss_scale`` after the first step, a second metric), the file is rewritten once with the
    wider header, the earlier rows leaving that column empty. Non-finite values are written as
    ``nan`` / ``inf`` (``float()`` reads them back). Rows reach the OS after each call (one call
    per batch of log lines); an existing file is appended to, its header kept. A resumed run cuts
    these files, and those of the earlier run folders, back to the checkpoint's iteration
    (:meth:`resume`): each iteration has one row.

    ``Trainer(writers=["console", "jsonl", "csv"])`` puts the files in ``<run folder>/csv/``.

    Args:
        dir: The folder of the CSV files (created on the first record).
    """

    def __init__(self, dir: str | Path) -> None:
        self.dir = Path(dir)
        self._files: dict[str, tuple[Any, list[str]]] = {}  # mode -> (open file, header)

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:  # noqa: D102
        self._write("train", records)

    def write_eval(self, record: dict[str, Any]) -> None:  # noqa: D102
        self._write(str(record.get("mode", "val")), [record])

    def flush(self) -> None:  # noqa: D102
        for fh, _ in self._files.values():
            fh.flush()

    def close(self) -> None:  # noqa: D102
        for fh, _ in self._files.values():
            fh.close()
        self._files = {}

    def resume(self, at: Resumed) -> None:
        """Drop the rows past ``at.iteration`` from these files and from those of each earlier run folder that trained
        (each file replaced atomically)."""
        self.close()  # reopened at the next record
        for train in at.places(self.path("train")):
            if train.exists():  # a folder that trained (a standalone evaluation's is left as it is)
                for mode in ("train", "val", "test"):
                    _cut(train.with_name(f"{mode}.csv"), at.iteration)

    def path(self, mode: str) -> Path:
        """The file of ``mode`` (``"train"``, ``"val"`` or ``"test"``)."""
        return self.dir / f"{mode}.csv"

    def _write(self, mode: str, records: list[dict[str, Any]]) -> None:
        fh, header = self._open(mode)
        new = [k for r in records for k in r if k not in header]
        if new:
            fh, header = self._widen(mode, list(dict.fromkeys(header + new)))
        writer = csv.DictWriter(fh, fieldnames=header, restval="")
        writer.writerows(records)
        fh.flush()

    def _open(self, mode: str) -> tuple[Any, list[str]]:
        entry = self._files.get(mode)
        if entry is None:
            path = self.path(mode)
            header: list[str] = []
            if path.exists() and path.stat().st_size > 0:
                with open(path, newline="", encoding="utf-8") as f:
                    header = next(csv.reader(f), [])
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
            entry = self._files[mode] = (open(path, "a", newline="", encoding="utf-8"), header)  # noqa: SIM115 - kept open for the run
        return entry

    def _widen(self, mode: str, header: list[str]) -> tuple[Any, list[str]]:
        """Rewrite the file of ``mode`` with ``header`` (atomically: a crash keeps the old file)."""
        fh, _ = self._files.pop(mode)
        fh.close()
        path = self.path(mode)
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=header, restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)
        entry = self._files[mode] = (open(path, "a", newline="", encoding="utf-8"), header)  # noqa: SIM115 - kept open for the run
        return entry


def _cut(path: Path, iteration: int) -> None:
    """Drop the rows of the CSV file ``path`` whose ``iter`` is past ``iteration`` (the header kept; replaced
    atomically, only when a row goes)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            rows = list(reader)
    except FileNotFoundError:
        return
    if header is None or "iter" not in header:
        return
    col = header.index("iter")
    kept = [r for r in rows if not (len(r) > col and r[col].isdigit() and int(r[col]) > iteration)]
    if len(kept) == len(rows):
        return
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(kept)
    replace_text(path, out.getvalue())
