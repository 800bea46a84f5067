"""Logs that rewind: after ``kill -9`` at random moments and a resume, every iteration is logged once, as in an
uninterrupted run.

``rewind_train.py`` logs every iteration at once (``interval=1, flush_secs=0``) and checkpoints
every 5: a killed run has logged iterations past its last checkpoint, which the resumed run
logs again. Read back as a user does: every run folder's ``metrics.jsonl`` and CSV, TensorBoard's
``EventAccumulator`` over the work dir's event folders, ``trainwright plot``'s reader.
"""

from __future__ import annotations

import csv
import json
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from forked import ForkedRun, ForkServer

SCRIPT = Path(__file__).with_name("rewind_train.py")
ITERS = 20
KEYS = ("loss", "lr")  # the numbers a resume reproduces bit for bit (times are the clock's)


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """The runs' processes are forked from one that imported torch once (each run is still a process of its own)."""
    server = ForkServer({**os.environ, "PYTHONUNBUFFERED": "1"}, tmp_path_factory.mktemp("forks") / "server.log")
    yield server
    server.close()


def _start(forks: ForkServer, work: Path) -> ForkedRun:
    return forks.start(SCRIPT, [str(work)], env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _kill_at(p: ForkedRun, at: int) -> int:
    """SIGKILL ``p`` once it printed ``iter <at>`` (it runs on meanwhile: a random moment); the last iteration seen."""
    last = 0
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("iter "):
            last = int(line.split()[1])
            if last >= at:
                break
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    return last


def _finish(p: ForkedRun) -> None:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]


def _jsonl(work: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for f in sorted(work.glob("*/metrics.jsonl"))
        for line in f.read_text().splitlines()
        if json.loads(line)["mode"] == "train"
    ]


def _csv(work: Path) -> list[dict[str, str]]:
    rows = []
    for f in sorted(work.glob("*/csv/train.csv")):
        with open(f, newline="") as fh:
            rows += list(csv.DictReader(fh))
    return rows


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_kill_9_at_random_moments_then_resume_logs_each_iteration_once(tmp_path: Path, forks: ForkServer) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainwright.cli.plot import load_records

    ref_p = _start(forks, tmp_path / "ref")  # the uninterrupted run, beside the killed ones
    work = tmp_path / "work"
    rng = random.Random(40)
    start, kills = 0, []
    for _ in range(2):  # two kills at random iterations after a checkpoint, each resumed
        at = rng.randint(max(start, 5) + 1, ITERS - 6)  # iterations left after it: the kill lands before the end
        kills.append(_kill_at(_start(forks, work), at))
        start = kills[-1] - kills[-1] % 5  # the newest checkpoint at or before the kill (a kill inside a save: older)
    _finish(_start(forks, work))
    _finish(ref_p)
    assert len(list(work.glob("2*"))) == 3, kills  # three run folders: killed, killed, finished

    ref = {r["iter"]: r for r in _jsonl(tmp_path / "ref")}
    assert sorted(ref) == list(range(1, ITERS + 1))

    got = _jsonl(work)
    assert sorted(r["iter"] for r in got) == list(range(1, ITERS + 1)), kills  # each iteration once
    for r in got:
        assert {k: r[k] for k in KEYS} == {k: ref[r["iter"]][k] for k in KEYS}, r["iter"]  # bit for bit
    assert [r["iter"] for r in load_records(work) if r["mode"] == "train"] == list(range(1, ITERS + 1))

    rows = _csv(work)
    assert sorted(int(r["iter"]) for r in rows) == list(range(1, ITERS + 1)), kills
    for row in rows:
        assert {k: float(row[k]) for k in KEYS} == {k: ref[int(row["iter"])][k] for k in KEYS}

    # TensorBoard: one event folder in the work dir (the resumed runs write on in the first run's), each step once
    tb_dirs = sorted({f.parent for f in work.rglob("events.out.tfevents.*")})
    assert len(tb_dirs) == 1, tb_dirs
    acc = EventAccumulator(str(tb_dirs[0]))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, ITERS + 1)), kills
    ref_acc = EventAccumulator(str(next((tmp_path / "ref").glob("*/tensorboard"))))
    ref_acc.Reload()
    assert [e.value for e in loss] == [e.value for e in ref_acc.Scalars("train/loss")]  # float32, equal


def test_files_are_cut_back_in_the_folders_that_trained_and_left_alone_elsewhere(tmp_path: Path) -> None:
    from trainwright.logging import CsvWriter, JsonlWriter, Resumed

    killed, evaluated, now = (tmp_path / n for n in ("a_killed", "e_val_only", "z_now"))
    recs = [{"mode": "train", "epoch": 0, "iter": i, "loss": i / 3} for i in range(1, 14)]
    recs.insert(10, {"mode": "val", "epoch": 0, "iter": 10, "val/acc": 0.5})
    recs.append({"mode": "val", "epoch": 0, "iter": 13, "val/acc": 0.75})
    for w in (JsonlWriter(killed / "metrics.jsonl"), CsvWriter(killed / "csv")):
        w.write_train([r for r in recs if r["mode"] == "train"], [])
        w.write_eval(recs[10])
        w.write_eval(recs[-1])
        w.close()
    (killed / "metrics.jsonl").write_text((killed / "metrics.jsonl").read_text() + '{"mode": "tra')  # torn by kill
    evaluated.mkdir()
    (evaluated / "metrics.jsonl").write_text('{"mode": "val", "epoch": 0, "iter": 20, "val/acc": 1.0}\n')
    before = (evaluated / "metrics.jsonl").read_bytes()

    at = Resumed.of(10, now)
    assert at.earlier == (killed, evaluated)
    JsonlWriter(now / "metrics.jsonl").resume(at)
    CsvWriter(now / "csv").resume(at)

    kept = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert kept == [r for r in recs if r["iter"] <= 10]
    with open(killed / "csv" / "train.csv", newline="") as f:
        assert [(r["iter"], float(r["loss"])) for r in csv.DictReader(f)] == [(str(i), i / 3) for i in range(1, 11)]
    with open(killed / "csv" / "val.csv", newline="") as f:
        assert [r["iter"] for r in csv.DictReader(f)] == ["10"]
    assert (evaluated / "metrics.jsonl").read_bytes() == before  # a standalone evaluation's records stay
    assert not list(tmp_path.rglob(".*.tmp.*"))  # no temporary file left
