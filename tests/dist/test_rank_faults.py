"""A fault on one rank of a 2-process DDP run (torchrun, gloo; worker: fault_train.py) ends the job in seconds, named.

Before these fixes: an exception on rank 1 idled the job for the collective timeout (30
minutes, the failing rank's ``Trainer.close()`` waited in a barrier); a validation error on
rank 1 crossed its clean-up's RNG gather with rank 0's metric gather; ranks given other
settings, seeds or checkpoints trained silently wrong; ``nonfinite_loss="skip"`` with a NaN on
one rank deadlocked; a stuck rank outlived its SIGTERM. Each launch is bounded (tests/launch.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from launch import Launched, launch

SCRIPT = Path(__file__).with_name("fault_train.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _launch(tmp_path: Path, scenario: str, *, timeout: float = 120, check: bool = False, nproc: int = 2) -> tuple[Launched, float]:
    """The scenario under torchrun (2 processes; 1: plain python); returns the launch and the seconds from the fault
    to the job's end."""
    out = launch(SCRIPT, [str(tmp_path / "out"), scenario], tmp_path, nproc=nproc, timeout=timeout, check=check)
    ended = time.time()
    raised = tmp_path / "out" / "raised_at"
    return out, ended - float(raised.read_text()) if raised.is_file() else float("nan")


def _train_log(tmp_path: Path) -> str:
    (log,) = (tmp_path / "out" / "work").glob("*/train.log")
    return log.read_text()


def test_an_exception_on_one_rank_ends_the_job_in_seconds_and_rank_0_names_it(tmp_path: Path) -> None:
    """Rank 1 raises in a hook inside ``with Trainer(...)`` (default 30 min timeout): the job ends within 10 s, rank
    0's log names the error."""
    out, after = _launch(tmp_path, "hook-error")
    assert out.returncode != 0
    assert after < 10, f"the job ended {after:.1f} s after rank 1 raised"
    # rank 1's own traceback, in the launcher's output
    assert "ValueError: boom from rank 1 at iteration 3" in out.output
    log = _train_log(tmp_path)  # rank 0's train.log: its collective failed, and it names why
    # an iteration-based run: numbered as its lines
    assert "rank 1 failed: ValueError at iteration 3: boom from rank 1 at iteration 3" in log


def test_a_rank_whose_loader_runs_short_of_its_len_ends_the_job_at_once_naming_it(tmp_path: Path) -> None:
    """Rank 1's stream yields 3 of its declared 4 batches (rank 0 waits in batch 4's all-reduce): not a 30-minute
    idle, an error naming rank 1's loader."""
    out, after = _launch(tmp_path, "short-stream")
    assert out.returncode != 0
    assert after < 10, f"the job ended {after:.1f} s after rank 1's stream ran out"
    log = _train_log(tmp_path)
    assert "rank 1 failed: RuntimeError at epoch 1, iteration 3: train_dataloader on rank 1 yielded 3 batches in this pass over the data, but its len() is 4" in log


def test_a_stop_a_hook_sets_on_one_rank_stops_every_rank_at_the_same_point(tmp_path: Path) -> None:
    """``trainer.should_stop = True`` on rank 1 only: both ranks stop at the next agreement point, finish cleanly, and
    checkpoint.

    Before: rank 1 left the loop alone. Iteration-based: it waited in the metric gather while rank 0 waited in the
        all-reduce
    (the collective timeout); epoch-based: rank 1 skipped the validation and saved at once, its checkpoint's RNG gather
    crossed
    rank 0's metric gather (``KeyError: 0``) and epoch 1's checkpoint was lost.
    """
    out, _ = _launch(tmp_path, "stop-one-rank", check=True, timeout=90)
    r0, r1 = (torch.load(tmp_path / "out" / f"stop_rank{r}.pt") for r in (0, 1))
    assert r0 == r1
    assert r0["iter"] == 10  # requested at 3, agreed at the point of 10 (agreement.every), on both ranks
    # requested after epoch 1's hooks, agreed there: no validation, no epoch 2 on either rank
    assert r0["epoch"] == (1, 4)
    ckpts = tmp_path / "out" / "epoch" / "work" / "checkpoints"
    assert (ckpts / "epoch_1.pth").is_file() and (ckpts / "latest").read_text().strip() == "epoch_1.pth"


def test_a_checkpoint_only_one_ranks_copy_cannot_read_is_named_on_both_ranks(tmp_path: Path) -> None:
    """FSDP, node-local work dirs, rank 1's copy of the newest checkpoint broken: both ranks fall back together; each
    says what it saw.

    Before: only rank 0 warned, naming its own intact copy and advising to delete it; rank 1's warning was silenced.
    """
    out, _ = _launch(tmp_path, "corrupt-copy", check=True, timeout=120)
    work = tmp_path / "out"
    assert [torch.load(work / f"resumed_rank{r}.pt") for r in (0, 1)] == [4, 4]  # both resumed from iter_4
    rank0 = (
        f"Skipping checkpoint '{work / 'work0' / 'checkpoints' / 'iter_6.dcp'}', it cannot be loaded (Cannot read "
        "checkpoint"
    )
    assert rank0 in out.output and "on every rank: this rank's (0) copy reads, the read failed on rank(s) [1]" in out.output
    assert "repair or delete the directory on their node" in out.output
    rank1 = (
        f"Skipping checkpoint '{work / 'work1' / 'checkpoints' / 'iter_6.dcp'}', it cannot be loaded (Cannot read "
        "checkpoint"
    )
    assert rank1 in out.output and "on rank 1 (the read failed on rank(s) [1])" in out.output


def test_a_validation_error_on_one_rank_makes_no_crossed_collective(tmp_path: Path) -> None:
    """Rank 1's metric raises with the epoch's checkpoint due: no clean-up save (its RNG gather would meet rank 0's
    metric gather)."""
    out, after = _launch(tmp_path, "val-error")
    assert out.returncode != 0
    assert after < 10, f"the job ended {after:.1f} s after rank 1 raised"
    assert "KeyError: 0" not in out.output  # rank 0 received no RNG dicts as metric results
    log = _train_log(tmp_path)
    assert "rank 1 failed: KeyError at epoch 1, iteration 4: 'metric broke on rank 1'" in log
    assert "Not writing checkpoint epoch_1.pth: the run failed on this process (rank 0)" in log
    assert not (tmp_path / "out" / "work" / "checkpoints" / "epoch_1.pth").exists()


def test_ranks_given_other_settings_or_checkpoints_are_refused_at_start_and_the_seed_is_rank_0s(tmp_path: Path) -> None:
    """Another lr, batch size, FSDP model or resumed checkpoint on rank 1: an error on every rank at train() start
    naming it; another seed:
    rank 0's is used."""
    _launch(tmp_path, "settings", timeout=240, check=True)
    results = [torch.load(tmp_path / "out" / f"settings_rank{r}.pt", weights_only=True) for r in range(2)]
    e0, e1 = results[0]["errors"], results[1]["errors"]
    assert e0 == e1  # the same error on every rank
    assert e0["lr"].startswith("RanksDisagreeError: ")
    assert "optim_wrapper.optimizer.lr differs: rank 0 0.1, rank 1 0.2" in e0["lr"]
    assert "train_dataloader batches per epoch differs: rank 0 4, rank 1 8" in e0["batch"]
    assert "train_dataloader batch_size differs: rank 0 8, rank 1 4" in e0["batch"]
    assert e0["model"] == ("ModelsDisagreeError: The processes built different models: 'linear.bias' is of shape (1,), float32 on rank 0 "
                           "and absent on rank 1 (2 vs 1 tensors). Build the same model on every process (the config "
                           "or the code that "
                           "builds it must not depend on the rank).")
    assert e0["save"] is None
    resume = e0["resume"]  # compared before any rank reads a checkpoint (a sharded read is a collective)
    assert resume.startswith("ResumeDisagreeError: The processes of this run would resume from different checkpoints: rank 0 would resume "
        "from ")
    assert "save/work/checkpoints/iter_4.pth; rank 1 finds no checkpoint" in resume
    # another seed on rank 1: no error, both use rank 0's, and one epoch covers every sample once
    assert e0["seed"] is None and results[0]["seed"] == results[1]["seed"] == 0
    seen = results[0]["seen"] + results[1]["seen"]
    assert sorted(seen) == list(range(64))


def test_nonfinite_skip_with_a_nan_on_one_rank_finishes_with_equal_weights(tmp_path: Path) -> None:
    """nonfinite_loss='skip', a NaN loss on rank 1 only: every rank skips that micro-batch (agreed), both reach the end
    with the same weights.

    Also when accumulating 2 and the NaN is in the micro-batch that synchronises its window.
    """
    _launch(tmp_path, "nan-skip", check=True)
    results = [torch.load(tmp_path / "out" / f"nan_rank{r}.pt", weights_only=True) for r in range(2)]
    for case in ("plain", "accum"):
        r0, r1 = results[0][case], results[1][case]
        assert r0["iteration"] == r1["iteration"] == 8, case
        assert r0["skipped"] == r1["skipped"] == 1, case
        for k, v in r0["params"].items():
            assert torch.isfinite(v).all() and torch.equal(v, r1["params"][k]), (case, k)


def test_a_stuck_rank_exits_within_the_preemption_grace(tmp_path: Path) -> None:
    """Rank 0 stops stepping; rank 1 waits in the all-reduce and gets SIGTERM: with grace_s=2 the job ends within a
    few seconds."""
    out, after = _launch(tmp_path, "stuck")
    assert out.returncode != 0
    assert after < 2 * 2 + 4, f"the job ended {after:.1f} s after the SIGTERM"
    assert "no step boundary within grace_s=2.0 s after SIGTERM" in out.output


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    """One process: SIGTERM inside a step that then hangs; a second SIGTERM ends it at once (grace_s=30 not waited),
    status 143."""
    out, after = _launch(tmp_path, "second-signal", nproc=1)
    assert out.returncode == 143
    assert after < 5, f"the process ended {after:.1f} s after the second signal"
    assert "a second SIGTERM arrived before the stop was reached: exiting now with status 143" in out.output
