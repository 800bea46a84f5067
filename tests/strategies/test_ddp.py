"""DDP on two real gloo processes (torchrun) against one process: parity, one all-reduce per update, agreed NaN stop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trainwright as tw

SCRIPT = Path(__file__).with_name("ddp_train.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _run(tmp_path: Path, out: str, args: list[str], nproc: int) -> list[dict]:
    env = dict(os.environ, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else [sys.executable]
    proc = subprocess.run([*launcher, str(SCRIPT), str(tmp_path / out), *args], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [torch.load(tmp_path / out / f"result_rank{r}.pt", weights_only=True) for r in range(nproc)]


def test_ddp_two_processes_equal_one_process_on_the_full_batch(tmp_path: Path) -> None:
    """2 ranks x batch 8 (each its shard) == 1 process x batch 16, after 6 SGD-momentum steps."""
    ddp = _run(tmp_path, "ddp", ["8"], 2)
    single = _run(tmp_path, "single", ["16"], 1)[0]
    assert [r["strategy"] for r in ddp] == ["ddp", "ddp"] and single["strategy"] == "single"
    for r in ddp:
        for k, v in single["params"].items():
            torch.testing.assert_close(r["params"][k], v, atol=1e-6, rtol=0)
    assert ddp[0]["allreduces"] == 6  # one gradient all-reduce per step
    # rank 0 wrote the checkpoint and the logs; rank 1 wrote nothing of its own
    assert (tmp_path / "ddp" / "checkpoints" / "iter_6.pth").is_file()
    assert len(list((tmp_path / "ddp").glob("*/metrics.jsonl"))) == 1


def test_accumulation_all_reduces_once_per_update(tmp_path: Path) -> None:
    """accumulative_counts=4 over 8 iterations: 2 all-reduces (no_sync inside each window), same weights as 1 process."""
    ddp = _run(tmp_path, "ddp", ["4", "--accum", "4", "--iters", "8"], 2)
    single = _run(tmp_path, "single", ["8", "--accum", "4", "--iters", "8"], 1)[0]
    assert [r["allreduces"] for r in ddp] == [2, 2]
    for k, v in single["params"].items():
        torch.testing.assert_close(ddp[0]["params"][k], v, atol=1e-6, rtol=0)


def test_nan_on_one_rank_stops_both_at_the_same_iteration(tmp_path: Path) -> None:
    """Rank 1's loss turns NaN at its 3rd step: both ranks raise FloatingPointError at the same flush; nobody hangs."""
    res = _run(tmp_path, "nan", ["8", "--nan-rank", "1", "--nan-at", "3"], 2)
    errors = [r["error"] for r in res]
    assert all(e is not None and e.startswith("FloatingPointError at iteration 4") for e in errors), errors
    assert "NaN at iteration 3" in errors[1]  # the rank that saw it names the iteration
    # rank 0 stops at the same flush (its own loss turned NaN too: the all-reduced gradients were)


def test_ddp_run_stopped_and_resumed_equals_the_uninterrupted_run_bitwise(tmp_path: Path) -> None:
    """2 processes, 5 of 10 steps, resumed from the checkpoint of step 5 (mid-epoch: 4 steps per pass): the same weights, bit for bit."""
    full = _run(tmp_path, "full", ["8", "--iters", "10"], 2)
    _run(tmp_path, "split", ["8", "--iters", "5"], 2)
    resumed = _run(tmp_path, "split", ["8", "--iters", "10", "--resume"], 2)
    for a, b in zip(full, resumed):
        for k, v in a["params"].items():
            assert torch.equal(v, b["params"][k]), k


def test_single_strategy_under_a_launcher_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """strategy='single' as one of two launched processes would train two unrelated models: refused, with the fix."""
    for k, v in dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(RuntimeError, match="strategy='ddp'"):
        tw.Trainer(model=torch.nn.Linear(2, 1), work_dir=tmp_path, strategy="single")
