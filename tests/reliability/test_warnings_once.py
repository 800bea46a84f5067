"""Under torchrun every rank trains the same run, so a warning about the run is printed once (by rank 0), not once per
process.

Before: rank 1 printed each of them too (its Python warnings on stderr, its logger's warnings
on stdout). A warning about one rank (it names the rank) is still printed by that rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from launch import launch

SCRIPT = Path(__file__).with_name("warn_train.py")

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_run_warnings_are_printed_once_and_a_rank_s_own_warning_by_that_rank(tmp_path: Path) -> None:
    out = launch(SCRIPT, [str(tmp_path / "work")], tmp_path, nproc=2, timeout=180).output
    assert "rank 0 done" in out and "rank 1 done" in out
    assert out.count("ConstantLR(param_name='lr', begin=100, by_epoch=False) never applies") == 1, out[
        -6000:
    ]  # a Python warning
    assert out.count("param_scheduler ['LinearLR'] count(s) in epochs") == 1, out[-6000:]  # another
    assert out.count("CheckpointHook counts its interval in epochs") == 1, out[-6000:]  # a log warning
    assert out.count("rank 1 was given seed 6, rank 0 seed 5") == 1, out[-6000:]  # about rank 1: printed by rank 1
    (log,) = (tmp_path / "work").glob("*/train.log")
    text = log.read_text()
    assert "CheckpointHook counts its interval in epochs" in text
    # trainwright's Python warnings are in the run's log too (a batch job's user reads that file), once
    assert text.count("ConstantLR(param_name='lr', begin=100, by_epoch=False) never applies") == 1, text
