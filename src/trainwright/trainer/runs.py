"""Runs in a work_dir: a run folder of its own, and what changed since the run a checkpoint came from."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainwright.strategies.base import Strategy

#: Settings that name a run rather than configure it: not reported as changed on resume.
_RUN_NAMES = frozenset({"work_dir", "experiment_name", "resume", "load_from", "seed", "randomness"})


def config_changes(saved: Any, now: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """``{"a.b": (saved, now)}`` for every setting of ``now`` whose value differs from ``saved`` (plain nested
    dicts)."""
    if not isinstance(saved, Mapping):
        return {}
    out: dict[str, tuple[Any, Any]] = {}
    for k in sorted(set(saved) | set(now)):
        if not prefix and k in _RUN_NAMES:
            continue
        a, b = saved.get(k), now.get(k)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.update(config_changes(a, b, f"{prefix}{k}."))
        elif a != b and not (
            isinstance(a, str) and isinstance(b, str) and " at 0x" in a + b
        ):  # objects shown by address compare by identity only
            out[f"{prefix}{k}"] = (a, b)
    return out


def new_run_dir(work_dir: Path) -> Path:
    """Create and return ``work_dir/<YYYYmmdd_HHMMSS>``, or ``..._1``, ``_2``... when runs start in the same second."""
    base = time.strftime("%Y%m%d_%H%M%S")
    work_dir.mkdir(parents=True, exist_ok=True)
    for i in range(10_000):
        d = work_dir / (base if i == 0 else f"{base}_{i}")
        try:
            d.mkdir()
        except FileExistsError:
            continue
        return d
    raise FileExistsError(f"No free run folder name for {base} in {work_dir}")


#: What a trainer writes into its run folder before anything runs: the log, the records file, the config.
_BEFORE_A_RUN = ("train.log", "metrics.jsonl", "config.")


def remove_unused_run_dir(run_dir: Path, logger: logging.Logger) -> bool:
    """Remove ``run_dir`` when it holds only what a trainer writes before its first run (a job refused at ``train()``).

    Only plain files named ``train.log``, ``metrics.jsonl`` or ``config.*`` are removed, and the
    folder only when nothing else is in it; a folder with anything else (a writer's
    sub-folder, a file of the user's) is kept as it is. ``logger`` is flushed first (a later
    line would create the log again).

    Returns:
        True when the folder was removed.
    """
    try:
        entries = list(run_dir.iterdir())
    except OSError:
        return False
    if any(not e.is_file() or not e.name.startswith(_BEFORE_A_RUN) for e in entries):
        return False
    for h in logger.handlers:
        h.flush()
    try:
        for e in entries:
            e.unlink()
        run_dir.rmdir()
    except OSError:
        return False
    return True


def run_name(strategy: Strategy, work_dir: Path, experiment_name: str | None) -> str:
    """The run folder's name under ``work_dir``: ``experiment_name``, or a new timestamped folder that rank 0 names and
    creates (:func:`new_run_dir`), broadcast: every rank agrees even when their clocks straddle a second."""
    name = experiment_name or (new_run_dir(work_dir).name if strategy.is_main_process else None)
    return str(strategy.broadcast_object(name))
