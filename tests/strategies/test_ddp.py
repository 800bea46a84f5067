"""DDP on two real gloo processes (torchrun) against one process: parity, one all-reduce per update, agreed NaN stop."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from launch import Launched, gloo_env, launch

import trainwright as tw
from trainwright.checkpoint import read_latest

SCRIPT = Path(__file__).with_name("ddp_train.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _launch(
    tmp_path: Path,
    out: str,
    args: list[str],
    nproc: int,
    *,
    script: Path = SCRIPT,
    torchrun: tuple[str, ...] = ("--standalone",),
    check: bool = True,
) -> Launched:
    """``torchrun TORCHRUN --nproc_per_node=NPROC script OUT ARGS`` (plain python for one process), bounded."""
    return launch(script, [str(tmp_path / out), *args], tmp_path, nproc=nproc, torchrun=torchrun, check=check)


def _results(tmp_path: Path, out: str, nproc: int) -> list[dict]:
    return [torch.load(tmp_path / out / f"result_rank{r}.pt", weights_only=True) for r in range(nproc)]


def _run(tmp_path: Path, out: str, args: list[str], nproc: int, **kwargs: object) -> list[dict]:
    _launch(tmp_path, out, args, nproc, **kwargs)  # type: ignore[arg-type]
    return _results(tmp_path, out, nproc)


def _assert_bitwise(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k, v in x["params"].items():
            assert torch.equal(v, y["params"][k]), k


@pytest.fixture(scope="module")
def uninterrupted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 processes x batch 8, 10 steps (4 per pass over the data), never stopped: the reference of the restart tests
    and the DDP side of the parity test (one launch serves them all)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    _launch(tmp, "full", ["8", "--iters", "10"], 2)
    return tmp / "full"


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_dir: Path) -> list[dict]:
    """The uninterrupted run's results, per rank."""
    return _results(uninterrupted_dir.parent, uninterrupted_dir.name, 2)


@pytest.fixture(scope="module")
def single_accumulated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """1 process x batch 8, accumulative_counts=4 over 8 iterations: the reference of the accumulation tests."""
    tmp = tmp_path_factory.mktemp("single_accumulated")
    return _run(tmp, "single", ["8", "--accum", "4", "--iters", "8"], 1)[0]


def test_ddp_two_processes_equal_one_process_on_the_full_batch(
    tmp_path: Path, uninterrupted_dir: Path, uninterrupted: list[dict]
) -> None:
    """2 ranks x batch 8 (each its shard) == 1 process x batch 16, after 10 SGD-momentum steps."""
    ddp = uninterrupted
    single = _run(tmp_path, "single", ["16", "--iters", "10"], 1)[0]
    assert [r["strategy"] for r in ddp] == ["ddp", "ddp"] and single["strategy"] == "single"
    for r in ddp:
        for k, v in single["params"].items():
            torch.testing.assert_close(r["params"][k], v, atol=1e-6, rtol=0)
    assert ddp[0]["allreduces"] == 10  # one gradient all-reduce per step
    # rank 0 wrote the checkpoint and the logs; rank 1 wrote nothing of its own
    assert sorted(p.name for p in (uninterrupted_dir / "checkpoints").glob("*.pth")) == ["iter_10.pth"]
    assert len(list(uninterrupted_dir.glob("*/metrics.jsonl"))) == 1


def test_accumulation_all_reduces_once_per_update(tmp_path: Path, single_accumulated: dict) -> None:
    """accumulative_counts=4 over 8 iterations: 2 all-reduces (no_sync inside each window), same weights as 1
    process."""
    ddp = _run(tmp_path, "ddp", ["4", "--accum", "4", "--iters", "8"], 2)
    single = single_accumulated
    assert [r["allreduces"] for r in ddp] == [2, 2]
    for k, v in single["params"].items():
        torch.testing.assert_close(ddp[0]["params"][k], v, atol=1e-6, rtol=0)


def test_val_before_train_keeps_gradient_sync_control(tmp_path: Path, single_accumulated: dict) -> None:
    """val() first prepares the model: the optimizer built for train() still gets DDP's no_sync (2 all-reduces, not
    8), same weights."""
    ddp = _run(tmp_path, "valfirst", ["4", "--accum", "4", "--iters", "8", "--val-first"], 2)
    single = single_accumulated
    assert [r["allreduces"] for r in ddp] == [2, 2]
    for k, v in single["params"].items():
        torch.testing.assert_close(ddp[0]["params"][k], v, atol=1e-6, rtol=0)


def test_nan_on_one_rank_stops_both_at_the_same_iteration(tmp_path: Path) -> None:
    """Rank 1's loss turns NaN at its 3rd step: both ranks raise FloatingPointError at the same iteration; nobody hangs.

    The default agreement points are 10 iterations apart, so the end of training's flush (one
    collective) carries the NaN and raises on both, at 6.
    """
    res = _run(tmp_path, "nan", ["8", "--nan-rank", "1", "--nan-at", "3"], 2)
    errors = [r["error"] for r in res]
    assert all(e is not None and e.startswith("FloatingPointError at iteration 6") for e in errors), errors
    assert "NaN at iteration 3" in errors[1]  # the rank that saw it names the iteration
    # rank 0 stops at the same flush (its own loss turned NaN too: the all-reduced gradients were)


KILLED = [
    "8",
    "--iters",
    "10",
    "--save-every",
    "3",
    "--kill-rank",
    "1",
    "--kill-at",
    "5",
]  # checkpoint at 3 (mid-pass), rank 1 killed before step 5


def test_killed_run_resumed_equals_the_uninterrupted_run_bitwise(tmp_path: Path, uninterrupted: list[dict]) -> None:
    """kill -9 of rank 1 mid-epoch: the run fails (rank 0 is not left hanging); resumed from iteration 3 it ends bit
    for bit as the uninterrupted run."""
    proc = _launch(tmp_path, "killed", KILLED, 2, check=False)
    assert proc.returncode != 0
    assert not list((tmp_path / "killed").glob("result_rank*.pt"))  # neither rank finished
    assert (tmp_path / "killed" / "checkpoints" / "iter_3.pth").is_file()
    resumed = _run(tmp_path, "killed", [*KILLED, "--resume"], 2)
    _assert_bitwise(uninterrupted, resumed)
    assert [r["allreduces"] for r in resumed] == [7, 7]  # steps 4..10 only: it did resume


def test_elastic_restart_resumes_from_the_last_checkpoint(tmp_path: Path, uninterrupted: list[dict]) -> None:
    """torchrun --max-restarts=1: rank 1 is killed mid-epoch, torchrun restarts both, resume=True continues from
    iteration 3."""
    res = _run(
        tmp_path,
        "elastic",
        [*KILLED, "--resume"],
        2,
        torchrun=("--standalone", "--max-restarts=1", "--monitor-interval=0.5"),
    )
    _assert_bitwise(uninterrupted, res)
    assert [r["allreduces"] for r in res] == [7, 7]  # the restarted attempt ran steps 4..10


def test_two_nodes_on_localhost_equal_one_node(tmp_path: Path, uninterrupted: list[dict]) -> None:
    """Two torchrun launches of one process each (--nnodes=2, c10d rendezvous on localhost) train as one 2-process
    launch."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for node in (0, 1):
        torchrun = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--node_rank={node}",
            "--nproc_per_node=1",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=localhost:{port}",
            "--rdzv_id=two-nodes",
        ]
        procs.append(
            subprocess.Popen(
                [*torchrun, str(SCRIPT), str(tmp_path / "nodes"), "8", "--iters", "10"],
                env=gloo_env(tmp_path),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    res = _results(tmp_path, "nodes", 2)
    assert [r["world_size"] for r in res] == [2, 2]
    _assert_bitwise(uninterrupted, res)


def test_sigterm_saves_once_and_exits_cleanly_on_both_ranks(tmp_path: Path) -> None:
    """SIGTERM reaches rank 1 only, before step 3: both ranks stop at the next agreement point (10, the default
    cadence), one checkpoint, exit status 143."""
    proc = _launch(tmp_path, "term", ["8", "--iters", "20", "--signal-rank", "1", "--signal-at", "3"], 2, check=False)
    res = _results(tmp_path, "term", 2)
    assert [(r["exit_code"], r["iteration"], r["error"]) for r in res] == [(143, 10, None), (143, 10, None)], (
        proc.output[-3000:]
    )
    assert proc.returncode != 0  # torchrun reports the workers' status
    ckpts = tmp_path / "term" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("*.pth")) == ["iter_10.pth"]
    assert read_latest(ckpts) == "iter_10.pth"


def test_val_and_test_on_two_processes_equal_one_process_and_ddp_wraps_the_compiled_module(tmp_path: Path) -> None:
    """23 samples (odd): each rank evaluates its padded shard, the metrics drop the duplicate; compile=... happens
    before DDP wraps."""
    script = Path(__file__).with_name("ddp_eval_compile.py")
    launches = {"two": 2, "one": 1}
    for name in launches:
        (tmp_path / name).mkdir()  # each launch its own folder (its log, its TMPDIR)
    with ThreadPoolExecutor(len(launches)) as pool:  # independent launches: side by side, not one after the other
        for run in [pool.submit(_launch, tmp_path / name, "out", [], n, script=script) for name, n in launches.items()]:
            run.result()
    two = [json.loads((tmp_path / "two" / "out" / f"result_rank{r}.json").read_text()) for r in range(2)]
    one = json.loads((tmp_path / "one" / "out" / "result_rank0.json").read_text())
    assert one["world_size"] == 1 and [r["world_size"] for r in two] == [2, 2]
    for r in two:
        assert r["val"] == one["val"] and r["test"] == one["test"]  # exactly, on every rank
        assert r["val"]["val/n"] == 23 and r["val"]["val/ids"] is True  # every sample once, the padding dropped
        assert r["wrapper"] == "DistributedDataParallelWrapper" and r["wraps_compiled"]
        assert r["graphs_train"] >= 1  # the training forward that went through DDP ran compiled graphs


def test_single_strategy_under_a_launcher_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """strategy='single' as one of two launched processes would train two unrelated models: refused, with the fix."""
    for k, v in dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(RuntimeError, match="strategy='ddp'"):
        tw.Trainer(model=torch.nn.Linear(2, 1), work_dir=tmp_path, strategy="single")
