"""Chaos: kill -9 a training run at random moments (some inside a checkpoint write), resume each time.

The final weights, optimizer state and every logged training record must be bitwise
identical to those of a run that was never interrupted. Also: SIGTERM / SIGUSR1 make the
run save and exit with the documented status, and the resumed run ends identical too.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from forked import BackgroundRun, ForkedRun, ForkServer

SCRIPT = Path(__file__).with_name("chaos_train.py")
_NONDETERMINISTIC = {"time", "data_time", "samples_per_s", "tokens_per_s", "tflops", "mfu"}  # wall-clock derived


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env.update(TMPDIR=str(tmp), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """The runs' processes are forked from one that imported torch once (each run is still a process of its own)."""
    tmp = tmp_path_factory.mktemp("forks")
    server = ForkServer(_env(tmp), tmp / "server.log")
    yield server
    server.close()


def _start(
    forks: ForkServer,
    tmp_path: Path,
    work: Path,
    experiment: str,
    workers: int = 0,
    async_save: bool = False,
    **env: str,
) -> ForkedRun:
    args = [str(work), "--workers", str(workers), "--experiment", experiment, *(["--async-save"] if async_save else [])]
    return forks.start(SCRIPT, args, env=_env(tmp_path, **env))


def _run_to_end(forks: ForkServer, tmp_path: Path, work: Path, experiment: str, workers: int = 0, **kw: Any) -> None:
    _finish(_start(forks, tmp_path, work, experiment, workers, **kw))


def _finish(p: ForkedRun) -> None:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, f"run failed ({p.returncode}):\n{out[-2000:]}\n{err[-4000:]}"


class Reference(BackgroundRun):
    """An uninterrupted run started in the background (beside the runs a test kills); ``work()`` waits for its end."""

    def __init__(self, forks: ForkServer, tmp_path: Path, workers: int = 0) -> None:
        self.dir = tmp_path / "ref"
        super().__init__(_start(forks, tmp_path, self.dir, "ref", workers), timeout_s=120)

    def work(self) -> Path:
        self.finish()
        return self.dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, forks: ForkServer) -> Iterator[Reference]:
    """The uninterrupted run without loader workers, shared by the tests that compare with it."""
    ref = Reference(forks, tmp_path_factory.mktemp("chaos_ref"))
    yield ref
    ref.stop()


def _wait_for_iter(p: ForkedRun, target: int) -> int | None:
    """Read progress lines until iteration ``target``; return the start iteration or None if it ended."""
    assert p.stdout is not None
    start = None
    for line in p.stdout:
        if line.startswith("start "):
            start = int(line.split()[1])
        if line.startswith("iter ") and int(line.split()[1]) >= target:
            return start
    return None


def _train_records(work: Path) -> dict[int, list[dict[str, Any]]]:
    """Every training log record by iteration, over all the run folders of a work dir."""
    records: dict[int, list[dict[str, Any]]] = {}
    for f in sorted(work.glob("*/metrics.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r["mode"] == "train":
                records.setdefault(r["iter"], []).append({k: v for k, v in r.items() if k not in _NONDETERMINISTIC})
    return records


def _assert_same_tensors(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs (max abs diff {(a.double() - b.double()).abs().max().item()})"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _assert_same_tensors(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _assert_same_run(ref: Path, work: Path) -> None:
    r = torch.load(ref / "result.pt", weights_only=True)
    w = torch.load(work / "result.pt", weights_only=True)
    _assert_same_tensors(r["model"], w["model"], "model")
    _assert_same_tensors(r["optimizer"], w["optimizer"], "optimizer")
    ref_logs, logs = _train_records(ref), _train_records(work)
    assert sorted(logs) == sorted(ref_logs), "logged iterations differ"
    for it, recs in logs.items():
        for rec in recs:  # records written before a kill and again after the resume: all equal
            assert rec == ref_logs[it][0], f"iteration {it}: {rec} != {ref_logs[it][0]}"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_sigkill_at_random_moments_resumes_bitwise(tmp_path: Path, forks: ForkServer, reference: Reference) -> None:
    rng = random.Random(20240611)
    work = tmp_path / "chaos"
    total = 45  # 3 epochs x 15 iterations
    # Forced kills inside checkpoint writes: after the data is in the temp file but before the
    # rename (".pth"), and after the rename but before the latest pointer moves ("latest").
    plan: list[Any] = [
        ("replace", ".pth:1"),
        "random",
        ("replace", "latest:2"),
        "random",
        "random",
        ("replace", ".pth:2"),
        "random",
        "random",
        ("replace", "latest:1"),
        "random",
        "random",
        "random",
    ]
    kills = 0
    resumed_from: list[int] = []
    for attempt, step in enumerate(plan):
        async_save = attempt % 2 == 1  # background writes half of the time
        if step == "random":
            p = _start(forks, tmp_path, work, f"a{attempt:02d}", async_save=async_save, CHAOS_ITER_SLEEP="0.01")
            # we learn the start iteration from the first line, then kill 1..6 iterations later
            assert p.stdout is not None
            first = p.stdout.readline()
            while first and not first.startswith("start "):  # e.g. the warning that a killed run's lock was taken over
                first = p.stdout.readline()
            start = int(first.split()[1])
            resumed_from.append(start)
            if start >= total - 2:
                p.kill()
                p.wait()
                break
            target = min(total - 1, start + rng.randint(1, 6))
            if _wait_for_iter(p, target) is None and p.poll() is not None:
                pytest.fail(
                    f"run ended before iteration {target}: {p.returncode}\n{p.stderr.read() if p.stderr else ''}"
                )
            time.sleep(rng.uniform(0.0, 0.012))  # anywhere inside the next step
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=30)
        else:
            p = _start(forks, tmp_path, work, f"a{attempt:02d}", async_save=async_save, CHAOS_KILL_ON_REPLACE=step[1])
            p.communicate(timeout=120)
        assert p.returncode == -signal.SIGKILL, (
            f"attempt {attempt} ({step}) ended with {p.returncode}, expected SIGKILL"
        )
        kills += 1
    assert kills >= 10
    _run_to_end(forks, tmp_path, work, "final")
    _assert_same_run(reference.work(), work)
    assert len(set(resumed_from)) > 2, f"the kills did not land at different points: {resumed_from}"
    leftovers = [f.name for f in (work / "checkpoints").iterdir() if ".tmp." in f.name]
    assert leftovers == [], f"stale temporary files were not cleaned up: {leftovers}"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_preemption_signal_saves_exits_and_resumes_bitwise(
    tmp_path: Path, sig: signal.Signals, forks: ForkServer, reference: Reference
) -> None:
    work = tmp_path / "work"
    p = _start(forks, tmp_path, work, "first", CHAOS_ITER_SLEEP="0.01")
    _wait_for_iter(p, 9)  # between two periodic checkpoints (every 4 iterations)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + int(sig), f"exit status {p.returncode}:\n{err[-3000:]}"
    stopped_at = max([9] + [int(line.split()[1]) for line in out.splitlines() if line.startswith("iter ")])
    latest = (work / "checkpoints" / "latest").read_text().strip()
    assert latest == f"iter_{stopped_at}.pth", (latest, stopped_at)
    assert "done" not in out
    _run_to_end(forks, tmp_path, work, "second")
    _assert_same_run(reference.work(), work)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_immediate_restart_after_sigkill_with_loader_workers_is_not_refused(tmp_path: Path, forks: ForkServer) -> None:
    """Forked DataLoader workers outlive a ``kill -9`` of their parent for a few seconds; they must not hold its
    work-dir lock."""
    ref, work = Reference(forks, tmp_path, workers=2), tmp_path / "work"
    try:
        p = _start(forks, tmp_path, work, "killed", workers=2, CHAOS_ITER_SLEEP="0.02")
        assert _wait_for_iter(p, 8) is not None, p.stderr.read() if p.stderr else ""
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        _run_to_end(
            forks, tmp_path, work, "restarted", workers=2
        )  # at once: the killed run's workers may still be alive
        _assert_same_run(ref.work(), work)
    finally:
        ref.stop()
