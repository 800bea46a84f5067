"""A rank held up in a hook: rank 0's train.log names it, where it is and the collective rank 0 waits in (2 gloo
processes, before the collective timeout)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launch import launch

SCRIPT = Path(__file__).with_name("stall_ranks_train.py")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_rank_0_names_the_rank_behind_its_position_and_the_collective_it_waits_in(tmp_path: Path) -> None:
    # rank 1 sleeps 6 s before iteration 3; stall timeout 1 s, gloo timeout 60 s: the run ends normally afterwards, so
    # the report was written while rank 0 still waited in its collective
    out = launch(SCRIPT, [str(tmp_path / "w")], tmp_path, nproc=2, timeout=150)
    log = (tmp_path / "w" / "run" / "train.log").read_text()
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
