"""The benchmark scripts run as documented (docs/benchmarks.md) and check what they claim.

Short settings only (few steps, so the time a test takes is bounded by its work, with wide
timeouts for a loaded machine): these guard the scripts against bit-rot and check their built-in
correctness claims (both sides of the overhead benchmark end with the same final loss); the
speed numbers themselves are measured by hand on an idle machine, not asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], tmp_path: Path, timeout: int) -> str:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    res = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{args[0]} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_overhead_benchmark_runs_and_both_sides_end_with_the_same_loss(tmp_path: Path) -> None:
    out_json = tmp_path / "overhead.json"
    stdout = _run(
        [
            "benchmarks/overhead.py",
            "--rounds",
            "1",
            "--only",
            "A,C,E",
            "--no-rss",
            "--import-reps",
            "1",
            "--steps",
            "20",  # two logging iterations (every 10), five accumulation windows of 4 in C
            "--threads",
            "1",
            "--json",
            str(out_json),
        ],
        tmp_path,
        timeout=900,
    )
    results = json.loads(out_json.read_text())["results"]
    assert [r["workload"] for r in results] == ["A", "C", "E"]
    for r in results:
        # The same model, data and optimizer: trainwright and the hand-written loop agree to the last bit.
        assert r["same_final_loss"] and r["raw_final_loss"] == r["trainwright_final_loss"], r
        assert r["ratio"] > 0 and r["engine_us_per_step"] == pytest.approx(
            (r["trainwright_s"] - r["raw_s"]) / r["steps"] * 1e6
        )
    assert "benchmarks/ddp.py" in stdout and "import trainwright on top of torch" in stdout


@pytest.mark.slow
@pytest.mark.timeout(1000)
@pytest.mark.multiprocess
def test_ddp_benchmark_runs_and_both_sides_end_with_the_same_loss(tmp_path: Path) -> None:
    stdout = _run(["benchmarks/ddp.py", "--rounds", "1", "--steps", "20"], tmp_path, timeout=900)
    row = next(line for line in stdout.splitlines() if line.startswith("D "))
    assert row.split()[-1] == "True", stdout  # same final loss on both sides


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_checkpoint_benchmark_runs(tmp_path: Path) -> None:
    stdout = _run(
        ["benchmarks/checkpoint.py", "--params", "2000000", "--repeats", "1", "--dir", str(tmp_path)],
        tmp_path,
        timeout=900,
    )
    for row in ("raw disk", "sync save", "async save", "async stall / sync stall"):
        assert row in stdout, stdout


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_overhead_breakdown_runs(tmp_path: Path) -> None:
    stdout = _run(["benchmarks/overhead_breakdown.py", "--rounds", "1", "--steps", "20"], tmp_path, timeout=900)
    for variant in ("raw", "train_step", "trainer", "+logger", "default"):
        assert f"  {variant} " in stdout, stdout


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_ui_overhead_runs(tmp_path: Path) -> None:
    stdout = _run(
        ["benchmarks/ui_overhead.py", "--rounds", "1", "--steps", "20", "--threads", "1"], tmp_path, timeout=900
    )
    for row in (
        "1. one hook call",
        "2. workload A, default hooks",
        "3. progress bar: 0 hook calls per training iteration",
    ):
        assert row in stdout, stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_startup_benchmark_runs_and_both_sides_train_the_same_weights(tmp_path: Path) -> None:
    out_json = tmp_path / "startup.json"
    stdout = _run(
        [
            "benchmarks/startup.py",
            "--rounds",
            "1",
            "--steps",
            "2",
            "--dim",
            "32",
            "--depth",
            "1",
            "--cli-reps",
            "0",
            "--warmups",
            "0",
            "--json",
            str(out_json),
        ],
        tmp_path,
        timeout=500,
    )
    runs = json.loads(out_json.read_text())["runs"]
    raw, tw = runs["raw"][0], runs["trainwright"][0]
    assert raw["weights_sum"] == tw["weights_sum"]  # same init, data and AdamW: the default hooks change no number
    assert tw["save_s"] > 0 and raw["save_s"] > 0 and 0 < tw["import_trainwright_s"] < tw["first_step_s"]
    assert "same final weights on both sides in every round: yes" in stdout
