"""Resumed: what a resumed run tells its writers, so each continues the logs of the runs it resumes (no iteration
twice)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple


class Resumed(NamedTuple):
    """A run that resumed from a checkpoint, as the logger hook tells its writers before the first record.

    Records past :attr:`iteration` that earlier runs wrote (a killed run logs beyond its last
    checkpoint) are superseded: this run writes those iterations again. The logs of a work dir
    are one lineage, as its checkpoints are (``trainwright plot`` reads every run folder of it).
    """

    #: The checkpoint's iteration: what earlier runs logged up to it stays, what they logged past it is superseded.
    iteration: int
    #: This run's folder.
    run_dir: Path
    #: The other run folders of the work dir, by name: the runs this one continues.
    earlier: tuple[Path, ...]

    @classmethod
    def of(cls, iteration: int, run_dir: Path) -> Resumed:
        """The resume of the run in ``run_dir`` at ``iteration``, its earlier runs the other folders beside it."""
        parent = run_dir.parent
        try:
            others = sorted(p for p in parent.iterdir() if p.is_dir() and p.name != run_dir.name)
        except OSError:
            others = []
        return cls(iteration, run_dir, tuple(others))

    def places(self, path: Path) -> list[Path]:
        """``path`` and, when it lies in this run's folder, the same place in each earlier run folder (those first).

        A writer's file outside the run folder (a path given by the user) is its own only.
        """
        try:
            rel = Path(path).absolute().relative_to(self.run_dir.absolute())
        except ValueError:
            return [Path(path)]
        return [d / rel for d in self.earlier] + [Path(path)]


def newest(paths: Sequence[Path]) -> Path | None:
    """The most recently modified of ``paths`` that exist (None: none exists)."""
    found = []
    for p in paths:
        try:
            found.append((p.stat().st_mtime, p))
        except OSError:
            continue
    return max(found)[1] if found else None


def replace_text(path: Path, text: str) -> None:
    """Replace the content of ``path`` with ``text`` atomically (a temporary file renamed over it): a crash leaves the
    old or the new file, never a part."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
