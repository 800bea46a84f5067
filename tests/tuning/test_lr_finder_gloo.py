"""find_lr under 2 gloo processes: every rank sees the same curve, and training after it equals training without, bitwise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from launch import launch

SCRIPT = Path(__file__).with_name("lr_rank_train.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_find_lr_under_ddp_leaves_both_ranks_unchanged(tmp_path: Path) -> None:
    launch(SCRIPT, [str(tmp_path / "out")], tmp_path, nproc=2, timeout=240)
    r0, r1 = (torch.load(tmp_path / "out" / f"rank{r}.pt") for r in range(2))
    assert r0["lrs"] == r1["lrs"] and r0["losses"] == r1["losses"] and r0["suggestion"] == r1["suggestion"]  # losses averaged over ranks
    assert 2 <= len(r0["lrs"]) <= 12
    for r in (r0, r1):
        assert all(torch.equal(a, b) for a, b in zip(r["tuned"], r["plain"], strict=True))  # weights, dropout masks, data order: as without
    assert all(torch.equal(a, b) for a, b in zip(r0["tuned"], r1["tuned"], strict=True))
