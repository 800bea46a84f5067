"""Two gloo processes, one launch (stall_ranks_train.py): a rank held up in a hook, and a rank held up in a slow fetch
when the preemption signal comes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from launch import Launched, launch

SCRIPT = Path(__file__).with_name("stall_ranks_train.py")


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Launched]:
    tmp = tmp_path_factory.mktemp("ranks")
    return tmp / "w", launch(SCRIPT, [str(tmp / "w")], tmp, nproc=2, timeout=240)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_rank_0_names_the_rank_behind_its_position_and_the_collective_it_waits_in(
    launched: tuple[Path, Launched],
) -> None:
    # rank 1 sleeps 6 s before iteration 3; stall timeout 1 s, gloo timeout 60 s: the run ends normally afterwards, so
    # the report was written while rank 0 still waited in its collective
    work, out = launched
    log = (work / "run" / "train.log").read_text()
    (line,) = [x for x in log.splitlines() if "Stall across the ranks" in x]
    assert "rank 1 is behind: at iteration 2, in hook SleepyHook.before_train_iter" in line, line
    assert re.search(r"stall_ranks_train\.py:\d+ in held_up_in_user_code: time\.sleep\(seconds\)", line), line
    assert "rank 0 waits in DDP's gradient all-reduce (inside backward) (at iteration 2, in backward)" in line, line
    assert "Iter(train) [5/5]" in log  # the run went on: no collective timed out
    # the summary came within the stall: before iteration 3 finished (6 s later)
    stamp = re.compile(r"^\d\d/\d\d (\d\d):(\d\d):(\d\d) ")

    def seconds(text: str) -> int:
        h, m, s = map(int, stamp.match(text).groups())  # type: ignore[union-attr]
        return 3600 * h + 60 * m + s

    (third,) = [x for x in log.splitlines() if "Iter(train) [3/5]" in x]
    assert seconds(third) - seconds(line) >= 3, (line[:40], third[:40])
    # every rank's full report stays in its own output: rank 1's names its own stack
    assert "No iteration finished on rank 1 for" in out.output and "in held_up_in_user_code" in out.output


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_rank_waiting_for_a_slow_fetch_waits_past_the_grace_and_both_save_at_the_same_iteration(
    launched: tuple[Path, Launched],
) -> None:
    # SIGTERM on both ranks inside the fetch of batch 3, which takes 3 s on rank 1; grace_s=1: rank 0 waits in DDP's
    # all-reduce for it (rank 1's watchdog says, through the launcher's store, that it is in its own work)
    work, _ = launched
    got = json.loads((work / "preempt.json").read_text())
    assert got["stopped_at"] == 10  # the agreement point after the signal (every 10 iterations), on both ranks
    assert 3.0 * 0.9 <= got["seconds"] <= 3.0 + 8.0, got  # the fetch, 8 iterations of a tiny model, one save
    assert got["resumed_iters"] == 16 and got["exact"], got  # resumed == uninterrupted, bit for bit
    log = (work / "preempt" / "run" / "train.log").read_text()
    assert (
        "this rank waits in backward, DDP's gradient all-reduce (inside backward) past grace_s=1.0 s for rank 1 (in "
        "data), work that ends by itself" in log
    ), log[-3000:]
    assert "Preempted at iteration 10: this iteration was checkpointed already" in log
    assert "without a checkpoint" not in log
