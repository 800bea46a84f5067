"""A NaN on one rank under torchrun (2 gloo processes): every rank's error and rank 0's train.log name the first bad
iteration and its rank.

Before: the agreement carried the first bad iteration only; a rank that had not seen it said
"on another process", and rank 0's own loss turned NaN one iteration later (the all-reduced
gradients), so its log never named the rank that saw the NaN first (issue #27, item 7).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launch import launch

SCRIPT = Path(__file__).with_name("nan_rank_train.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_a_nan_on_rank_1_is_named_with_its_iteration_and_rank_on_every_rank(tmp_path: Path) -> None:
    launch(SCRIPT, [str(tmp_path / "out")], tmp_path, nproc=2, timeout=120, check=True)
    errors = [(tmp_path / "out" / f"error_rank{r}.txt").read_text().split("\n", 1) for r in range(2)]
    (at0, e0), (at1, e1) = errors
    assert at0 == at1 == "20"  # raised on both at the same agreement point
    # the rank that saw it names its losses
    assert e1.startswith("Loss became infinite or NaN at iteration 17 on rank 1: {'loss': nan}")
    assert e0.startswith("Loss became infinite or NaN at iteration 17 on rank 1; that process's error names its losses")
    lines = (tmp_path / "out" / "work" / "run" / "train.log").read_text().splitlines()
    assert "Stopped by FloatingPointError on rank 0 at iteration 20: Loss became infinite or NaN at iteration 17 on rank 1" in lines[-1]
