"""``verify_resume``: train a config uninterrupted and again restarted in fresh processes, then compare bitwise.

Each training run is a child process (``torch.distributed.run`` for several) of the worker in
:mod:`trainwright.cli.verify_resume`, which builds the trainer from the config and adds a
:class:`~trainwright.verify.probe.ResumeProbe`; this module plans the runs, starts them and compares.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from trainwright.registry import ConfigError
from trainwright.verify.compare import (
    Check,
    ResumeReport,
    RunRecords,
    compare_checkpoints,
    compare_steps,
    compare_validation,
    read_checkpoint,
    restart_check,
)
from trainwright.verify.probe import record_file

__all__ = ["VerifyRunError", "config_of_run", "default_restarts", "describe_restart", "verify_resume"]

#: The module each run's processes execute (``python -m``): it builds the trainer from the config, so it lives above
#: the config and trainer layers; this module only names it, across the process boundary.
WORKER_MODULE = "trainwright.cli.verify_resume"

#: The default length of the runs, in epochs of the config's train loader (capped by its own length).
DEFAULT_EPOCHS = 2


class VerifyRunError(RuntimeError):
    """One of the verification's training runs failed (its log's tail is in the message)."""


def default_restarts(steps: int, epoch_len: int, accumulation: int = 1) -> list[int]:
    """Where to stop and restart a run of ``steps`` steps: inside the first epoch, inside an accumulation window (when
    the run accumulates), at the epoch's last batch; always two restarts at least, so one resumes a resumed run.

    Raises:
        ConfigError: ``steps`` is too short to restart inside it (under 3).
    """
    if steps < 3:
        raise ConfigError(f"verify-resume needs at least 3 steps to restart inside them, got --steps {steps}")
    e, acc = max(1, epoch_len), max(1, accumulation)
    inside = max(1, e // 3)
    if acc > 1 and inside > acc:
        inside -= inside % acc  # at a window boundary: the window case is the next one
    wanted = [inside]
    if acc > 1:
        mid = max(inside + 1, (2 * e) // 3)
        wanted.append(mid + 1 if mid % acc == 0 else mid)
    wanted.append(e)
    ks = sorted({k for k in wanted if 0 < k < steps})
    if len(ks) < 2:  # a short run: restart twice inside it anyway
        ks = sorted({*ks, max(1, steps // 3), max(2, (2 * steps) // 3)} - {steps})[:3]
    return ks


def describe_restart(k: int, epoch_len: int, accumulation: int = 1) -> str:
    """Where iteration ``k`` lies: ``"inside epoch 1"``, ``"epoch 1's last batch"``, ``"... inside an accumulation
    window"``."""
    e = max(1, epoch_len)
    where = f"epoch {k // e}'s last batch" if k % e == 0 else f"inside epoch {k // e + 1}"
    if accumulation > 1 and (k % e) % accumulation != 0:
        where += ", inside an accumulation window"
    return where


def config_of_run(run_dir: str | Path) -> Path:
    """The config a trainer built from a config wrote into its run folder (``config.py`` / ``.yaml`` / ``.json``).

    Raises:
        ConfigError: there is none (a trainer built in Python from objects): fresh processes cannot rebuild it.
    """
    for suffix in (".py", ".yaml", ".yml", ".json"):
        path = Path(run_dir) / f"config{suffix}"
        if path.is_file():
            return path
    raise ConfigError(
        f"verify_resume rebuilds the run in fresh processes from its config, and {run_dir} holds none: this trainer "
        "was not built by Trainer.from_config. Pass config=PATH (a config file that builds this run) or run "
        "`trainwright verify-resume CONFIG`"
    )


def verify_resume(
    config: str | Path,
    *,
    steps: int | None = None,
    at: Sequence[int] | None = None,
    nproc: int = 1,
    work_dir: str | Path | None = None,
    cfg_options: Sequence[str] = (),
    timeout_s: float = 3600.0,
    echo: Callable[[str], None] | None = None,
) -> ResumeReport:
    """Train ``config`` ``steps`` steps uninterrupted, then again stopping and restarting in a fresh process at each of
    ``at``, and compare the two runs bitwise.

    Compared: the batch of every step (a checksum) and its losses, every validation's metrics, and in the final
    checkpoints every parameter, the optimizer's and the schedulers' state, the random streams and the data position.
    Each restart resumes (``resume=True``) from the checkpoint saved when the previous process stopped.

    Args:
        config: The config file (``.py`` / ``.yaml`` / ``.json``).
        steps: Steps of each run (default: two epochs of the train loader when that is at most 200 steps, else 40;
            at most the config's length).
        at: The iterations to stop and restart at (default :func:`default_restarts`).
        nproc: Processes per run (``torch.distributed.run``; gloo on CPU).
        work_dir: An empty folder for the runs (default: a new temporary folder); kept afterwards.
        cfg_options: ``KEY=VALUE`` overrides of the config, as ``trainwright train --cfg-options``.
        timeout_s: Seconds each process may take before it is stopped and the verification fails.
        echo: Called with a line per finished run (progress).

    Returns:
        The :class:`~trainwright.verify.compare.ResumeReport` (``report.ok``, ``report.table()``).

    Raises:
        ConfigError: bad arguments, or restarts outside the run.
        VerifyRunError: a training run failed or timed out (its log is named).
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ConfigError(f"verify-resume --nproc must be at least 1, got {nproc!r}")
    if steps is not None and (not isinstance(steps, int) or steps < 2):
        raise ConfigError(f"verify-resume --steps must be at least 2, got {steps!r}")
    wanted = sorted(set(at or ()))
    if any(not isinstance(k, int) or k < 1 for k in wanted):
        raise ConfigError(f"verify-resume --at takes iterations >= 1, got {list(at or ())}")
    if steps is not None and wanted and wanted[-1] >= steps:
        raise ConfigError(
            f"verify-resume --at {wanted}: every restart must come before the last step (--steps {steps})"
        )
    root = _empty_folder(work_dir)
    say = echo or (lambda line: None)
    launch = _Launcher(Path(config).resolve(), list(cfg_options), nproc, timeout_s)

    ref_dir = root / "reference"
    launch.run(ref_dir, 0, resume=False, stop_at=steps, what="the uninterrupted run")
    ref = RunRecords(_record_files(ref_dir, 1, nproc))
    shape = ref.starts.get((0, 0))
    end = ref.ends.get((0, 0))
    if shape is None or end is None:
        raise VerifyRunError(f"the uninterrupted run left no records in {ref_dir / 'records'}: see {ref_dir}")
    n = int(end["end"])
    e, acc = int(shape["epoch_len"]), int(shape["accumulation"])
    notes = []
    if steps is not None and n < steps:
        notes.append(f"note: the config trains {n} steps, fewer than --steps {steps}: {n} steps compared")
    restarts = wanted or default_restarts(n, e, acc)
    outside = [k for k in restarts if k >= n]
    if outside:
        raise ConfigError(f"verify-resume --at {outside}: a restart must come before the run's last step ({n})")
    say(f"uninterrupted run: {n} steps ({launch.last_s:.1f} s)")
    if wanted == [] and n <= e:
        notes.append(
            f"note: the run is not longer than an epoch ({e} steps): no restart at an epoch's end (--steps {e + 1}"
            " or more for one)"
        )
    notes.append(
        "restarts: " + ", ".join(f"{k} ({describe_restart(k, e, acc)})" for k in restarts) + f"; epoch = {e} steps"
    )

    run_dir = root / "resumed"
    for segment, stop in enumerate([*restarts, n]):
        what = "the first process" if segment == 0 else f"the process restarted at {restarts[segment - 1]}"
        launch.run(run_dir, segment, resume=segment > 0, stop_at=stop, what=what)
        say(f"{what}: stopped at {stop} ({launch.last_s:.1f} s)")
    run = RunRecords(_record_files(run_dir, len(restarts) + 1, nproc))

    checks = [restart_check(run, restarts, nproc), *compare_steps(ref, run, n, nproc), compare_validation(ref, run)]
    paths = ref.checkpoint(0), run.checkpoint(len(restarts))
    if paths[0] is None or paths[1] is None:
        checks.append(Check("checkpoints", False, "a run saved no final checkpoint (see its log)", None))
    else:
        checks += compare_checkpoints(read_checkpoint(paths[0]), read_checkpoint(paths[1]), n)
    return ResumeReport(checks, n, list(restarts), root, notes)


def _empty_folder(work_dir: str | Path | None) -> Path:
    if work_dir is None:
        return Path(tempfile.mkdtemp(prefix="verify-resume-"))
    root = Path(work_dir)
    for sub in ("reference", "resumed"):
        if (root / sub).exists() and any((root / sub).iterdir()):
            raise ConfigError(
                f"{root / sub} holds an earlier verification's runs (they would be resumed from): pass an empty "
                "--work-dir, or delete it"
            )
    root.mkdir(parents=True, exist_ok=True)
    return root


def _record_files(folder: Path, segments: int, world: int) -> dict[tuple[int, int], Path]:
    files = {}
    for segment in range(segments):
        for rank in range(world):
            path = record_file(folder / "records", segment, rank)
            if path.is_file():
                files[(segment, rank)] = path
    return files


class _Launcher:
    """Starts one process (or ``torch.distributed.run`` with several) per run segment, bounded by a timeout."""

    def __init__(self, config: Path, cfg_options: list[str], nproc: int, timeout_s: float) -> None:
        self.config, self.cfg_options, self.nproc, self.timeout_s = config, cfg_options, nproc, timeout_s
        self.last_s = 0.0

    def run(self, work_dir: Path, segment: int, *, resume: bool, stop_at: int | None, what: str) -> None:
        records = work_dir / "records"
        records.mkdir(parents=True, exist_ok=True)
        spec = records / f"segment{segment}.json"
        spec.write_text(
            json.dumps(
                dict(
                    config=str(self.config),
                    cfg_options=self.cfg_options,
                    work_dir=str(work_dir),
                    resume=resume,
                    stop_at=stop_at,
                    epochs=DEFAULT_EPOCHS,
                    records=str(records),
                    segment=segment,
                ),
                indent=1,
            ),
            encoding="utf-8",
        )
        cmd = [sys.executable, "-m", WORKER_MODULE, str(spec)]
        if self.nproc > 1:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={self.nproc}",
                "-m",
                WORKER_MODULE,
                str(spec),
            ]
        log = records / f"segment{segment}.log"
        t0 = time.perf_counter()
        with open(log, "w", encoding="utf-8") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: torchrun and its workers
                proc.wait()
                raise VerifyRunError(
                    f"{what} did not finish within {self.timeout_s:g} s and was stopped; its log: {log}\n{_tail(log)}"
                ) from None
        self.last_s = time.perf_counter() - t0
        if code != 0:
            raise VerifyRunError(f"{what} failed (exit status {code}); its log: {log}\n{_tail(log)}")


def _tail(path: Path, lines: int = 60) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])
