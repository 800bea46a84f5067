"""A sweep's results: one :class:`TrialRecord` per trial, the :class:`SweepResult`, ``results.csv`` and the best config.

:func:`write_results` rewrites the table (and picks the best complete trial) after every
trial; :func:`write_best_config` dumps the config with the best trial's values.
"""

from __future__ import annotations

import copy
import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainwright.config import Config
from trainwright.sweeps.params import Param

_CONFIG_SUFFIXES = (".py", ".yaml", ".yml", ".json")


@dataclass
class TrialRecord:
    """One row of the results table.

    Attributes:
        number: Optuna's trial number (the work dir is ``trial_<number>``).
        state: ``COMPLETE``, ``PRUNED``, ``FAIL``, ``RUNNING`` or ``WAITING``.
        value: The metric at the trial's last validation (pruned: where it was stopped); None without one.
        params: The swept keys and the values this trial used.
        work_dir: The trial's work dir.
        note: Why it failed, where it was pruned, or which interrupted trial it re-runs.
    """

    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    work_dir: str
    note: str = ""


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns.

    Attributes:
        study_name: The Optuna study (continue it with the same storage and name).
        storage: The storage URL.
        metric: The optimised metric key.
        direction: ``"maximize"`` or ``"minimize"``.
        work_dir: Where the trials' work dirs, the results table and the best config are.
        trials: Every trial of the study, as the table lists them.
        best: The best complete trial (None if none completed).
        results_csv: The results table.
        best_config: The config with the best trial's values (None if none completed).
    """

    study_name: str
    storage: str
    metric: str
    direction: str
    work_dir: Path
    trials: list[TrialRecord] = field(default_factory=list)
    best: TrialRecord | None = None
    results_csv: Path | None = None
    best_config: Path | None = None

    def count(self, state: str) -> int:
        """How many trials are in ``state`` (``"COMPLETE"``, ``"PRUNED"``, ...)."""
        return sum(t.state == state for t in self.trials)


def _note(t: Any, TrialState: Any) -> str:
    notes = []
    if "rerun_of" in t.user_attrs:
        notes.append(f"re-runs interrupted trial {t.user_attrs['rerun_of']}")
    if t.state == TrialState.PRUNED and t.last_step is not None:
        notes.append(f"pruned at step {t.last_step}")
    if t.state == TrialState.FAIL:
        notes.append(str(t.user_attrs.get("error", "interrupted (the sweep was killed while it ran)")))
    return "; ".join(notes)


def write_results(study: Any, result: SweepResult, params: Sequence[Param], TrialState: Any) -> None:
    """The results table ``results.csv``: one row per trial (number, state, value, the swept keys, work dir, note)."""
    records = []
    for t in study.get_trials(deepcopy=False):
        value = t.value if t.state in (TrialState.COMPLETE, TrialState.PRUNED) else None
        records.append(
            TrialRecord(
                number=t.number,
                state=t.state.name,
                value=value,
                params=dict(t.params),
                work_dir=str(t.user_attrs.get("work_dir", result.work_dir / f"trial_{t.number}")),
                note=_note(t, TrialState),
            )
        )
    result.trials = records
    complete = [r for r in records if r.state == "COMPLETE" and r.value is not None]
    if complete:
        pick = max if result.direction == "maximize" else min
        result.best = pick(complete, key=lambda r: float(r.value))  # type: ignore[arg-type]
    path = result.work_dir / "results.csv"
    tmp = path.with_suffix(".csv.tmp")
    keys = [p.key for p in params]
    with tmp.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["number", "state", result.metric, *keys, "work_dir", "note"])
        for r in records:
            w.writerow(
                [
                    r.number,
                    r.state,
                    "" if r.value is None else repr(r.value),
                    *(r.params.get(k, "") for k in keys),
                    r.work_dir,
                    r.note,
                ]
            )
    tmp.replace(path)
    result.results_csv = path


def write_best_config(base: Config, result: SweepResult, out: Path) -> Path | None:
    """The config with the best trial's values (``best_config<suffix of the config file>``), written with
    :meth:`Config.dump`."""
    if result.best is None:
        return None
    best = copy.deepcopy(base)
    best.merge_from_dict(result.best.params)
    suffix = Path(base.filename).suffix if base.filename else ".py"
    return best.dump(out / f"best_config{suffix if suffix in _CONFIG_SUFFIXES else '.py'}")
