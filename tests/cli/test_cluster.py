"""Clusters through the ``trainwright train`` command: SLURM requeue on SIGUSR1, the launcher forwarding signals,
several nodes, srun and PyTorchJob environments.

Every run is ``trainwright train tests/cli/cluster_cfg.py`` in a subprocess (gloo on 127.0.0.1,
its own TMPDIR); a fake ``scontrol`` on PATH records its arguments. Results are each rank's
final weights (``result_rank<r>.pt``), compared bitwise unless a tolerance is stated. One-process
references run the same command in the test's own process (no start-up), and runs that do not
depend on each other run at the same time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from launch import gloo_env

from trainwright.checkpoint import read_latest
from trainwright.cli.main import main
from trainwright.cli.run import worker_pids

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CFG = str(Path(__file__).with_name("cluster_cfg.py"))
#: Variables of the machine running the tests that would change what a launch detects.
_JOB_VARS = ("SLURM_", "PET_", "TORCHELASTIC_", "OMPI_")


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in gloo_env(tmp).items() if not k.startswith(_JOB_VARS)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def fake_scontrol(bin_dir: Path, status: int = 0) -> Path:
    """A ``scontrol`` that appends its arguments to ``bin_dir/scontrol.args`` and exits with ``status``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    record = bin_dir / "scontrol.args"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> "{record}"\nexit {status}\n')
    (bin_dir / "scontrol").chmod(0o755)
    return record


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(tmp: Path, work: str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"{work}_{len(list(tmp.glob(f'{work}_*.log')))}.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainwright", "train", CFG, "--work-dir", str(tmp / work), *args],
            env=env or _env(tmp),
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=tmp,
        )
    return proc, log


def _finish(proc: subprocess.Popen[bytes], log: Path, timeout: float = 240) -> tuple[int, str]:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(timeout=60)
        pytest.fail(f"did not finish within {timeout} s:\n{log.read_text()[-6000:]}")
    return proc.returncode, log.read_text()


def _train(tmp: Path, work: str, *args: str, env: dict[str, str] | None = None) -> str:
    code, out = _finish(*_start(tmp, work, *args, env=env))
    assert code == 0, out[-6000:]
    return out


def _train_here(tmp: Path, work: str, *args: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``trainwright train CFG`` in this process, as :func:`_train` runs it in a child: no job variables, TMPDIR in
    ``tmp``, one thread."""
    with monkeypatch.context() as mp:
        for k in list(os.environ):
            if k.startswith(_JOB_VARS) or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
                mp.delenv(k)
        mp.delenv("CLUSTER_ITER_SLEEP", raising=False)
        mp.setenv("TMPDIR", str(tmp))
        mp.chdir(tmp)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            assert main(["train", CFG, "--work-dir", str(tmp / work), *args]) == 0
        finally:
            torch.set_num_threads(threads)


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"ended before {text!r}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < end, f"no {text!r} within {timeout} s"
        time.sleep(0.1)


def _weights(work: Path, world: int) -> list[dict[str, torch.Tensor]]:
    return [torch.load(work / f"result_rank{r}.pt", weights_only=True)["model"] for r in range(world)]


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if atol == 0.0:
            assert torch.equal(a[k], b[k]), f"{k}: max diff {(a[k] - b[k]).abs().max().item()}"
        else:
            torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


# -- SLURM requeue ----------------------------------------------------------------------------
@pytest.mark.timeout(600)
def test_sigusr1_under_slurm_saves_requeues_exits_0_and_the_requeued_job_ends_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process: SIGUSR1 mid-run → checkpoint, ``scontrol requeue 4242``, status 0; the same command again
    finishes like an uninterrupted run."""
    record = fake_scontrol(tmp_path / "bin")
    env = _env(
        tmp_path,
        SLURM_JOB_ID="4242",
        CLUSTER_ITER_SLEEP="0.05",
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
    )
    proc, log = _start(tmp_path, "job", env=env)
    _wait_for(log, "iter 5 ", proc)
    proc.send_signal(signal.SIGUSR1)
    _train_here(tmp_path, "ref", monkeypatch=monkeypatch)  # the uninterrupted run, while the job saves and exits
    code, out = _finish(proc, log)
    assert code == 0, out[-4000:]
    assert record.read_text().split() == ["requeue", "4242"]
    stopped = read_latest(tmp_path / "job" / "checkpoints")
    assert stopped is not None and 5 <= int(stopped[len("iter_") : -len(".pth")]) < 48
    assert not (tmp_path / "job" / "result_rank0.pt").exists()  # it did stop early
    out = _train(tmp_path, "job", env=env)  # the requeued job: the same command, resume=True in the config
    assert out.split("iter ")[1].split()[0] == str(
        int(stopped[len("iter_") : -len(".pth")]) + 1
    )  # it continued where it stopped
    _assert_equal(_weights(tmp_path / "ref", 1)[0], _weights(tmp_path / "job", 1)[0])
    assert record.read_text().split() == ["requeue", "4242"]  # called once


@pytest.mark.timeout(600)
def test_nproc_2_forwards_sigusr1_from_the_launcher_or_with_every_process_signalled(tmp_path: Path) -> None:
    """``--nproc 2``: SIGUSR1 to the launcher only reaches the workers; SIGUSR1 to launcher, torchrun and workers at
    once
    (SLURM's ``--signal=USR1@90``) kills nothing and counts once. Both requeue once and exit 0; the requeued run ends
    bitwise like an uninterrupted 2-process run.

    The uninterrupted run and both signalled runs run at the same time; each is signalled once its log shows iteration
    2."""
    ref = _start(tmp_path, "ref", "--nproc", "2")
    runs = {}
    for how in ("launcher", "everyone"):
        record = fake_scontrol(tmp_path / f"bin_{how}")
        env = _env(
            tmp_path,
            SLURM_JOB_ID="4242",
            CLUSTER_ITER_SLEEP="0.1",
            PATH=f"{tmp_path / f'bin_{how}'}{os.pathsep}{os.environ['PATH']}",
        )
        runs[how] = (*_start(tmp_path, how, "--nproc", "2", env=env), record)
    waiting = set(runs)
    end = time.monotonic() + 180
    while waiting:
        for how in sorted(waiting):
            proc, log, _ = runs[how]
            if "iter 2 " not in log.read_text():
                assert proc.poll() is None, f"ended before 'iter 2 ':\n{log.read_text()[-4000:]}"
                continue
            waiting.discard(how)
            if how == "launcher":
                proc.send_signal(signal.SIGUSR1)
            else:
                (torchrun,) = worker_pids(proc.pid)
                for pid in [proc.pid, torchrun, *worker_pids(torchrun)]:
                    os.kill(pid, signal.SIGUSR1)
        assert time.monotonic() < end, f"no 'iter 2 ' within 180 s in {sorted(waiting)}"
        time.sleep(0.1)
    for how, (proc, log, record) in runs.items():
        code, out = _finish(proc, log)
        assert code == 0, out[-6000:]
        assert "SIGUSR1 forwarded to the workers" in out
        assert record.read_text().split() == ["requeue", "4242"], out[-4000:]  # rank 0 only, once
        assert read_latest(tmp_path / how / "checkpoints") is not None
        assert not list((tmp_path / how).glob("result_rank*.pt"))
    code, out = _finish(*ref)
    assert code == 0, out[-6000:]
    _train(tmp_path, "launcher", "--nproc", "2", env=env)
    for a, b in zip(_weights(tmp_path / "ref", 2), _weights(tmp_path / "launcher", 2)):
        _assert_equal(a, b)


# -- several nodes, srun, PyTorchJob ------------------------------------------------------------
NO_DROPOUT = ("--cfg-options", "model.dropout=0.0")


@pytest.fixture(scope="module")
def two_process_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[], list[dict[str, torch.Tensor]]]]:
    """The reference: one ``--nproc 2`` launch on one node, started now; calling the fixture's value waits for it
    (once) and returns each rank's final weights, so the first test's own launches run meanwhile."""
    tmp = tmp_path_factory.mktemp("one_node")
    proc, log = _start(tmp, "w", "--nproc", "2", *NO_DROPOUT)
    weights: list[list[dict[str, torch.Tensor]]] = []

    def result() -> list[dict[str, torch.Tensor]]:
        if not weights:
            code, out = _finish(proc, log)
            assert code == 0, out[-6000:]
            weights.append(_weights(tmp / "w", 2))
        return weights[0]

    yield result
    if proc.poll() is None:  # no test asked for it
        proc.terminate()
        proc.wait(timeout=60)


def _together(
    tmp: Path, launches: list[tuple[list[str], dict[str, str]]], meanwhile: Callable[[], None] = lambda: None
) -> list[dict[str, torch.Tensor]]:
    """Start every ``(args, env)`` launch of one run (work dir ``w``) at once, call ``meanwhile``; each must exit 0."""
    started = [_start(tmp, "w", *args, env=env) for args, env in launches]
    meanwhile()
    for proc, log in started:
        code, out = _finish(proc, log)
        assert code == 0, out[-6000:]
    return _weights(tmp / "w", 2)


@pytest.mark.timeout(600)
def test_two_nodes_through_the_cli_equal_one_two_process_launch_and_one_process_on_the_full_batch(
    tmp_path: Path, two_process_run: Callable[[], list], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--nnodes 2 --node-rank R --rdzv-endpoint 127.0.0.1:PORT`` (one process each): bitwise the 2-process launch;
    within 1e-6 one process with batch 16 (in this process, while the nodes train)."""
    endpoint = f"127.0.0.1:{_free_port()}"
    nodes = _together(
        tmp_path,
        [
            (["--nnodes", "2", "--node-rank", str(r), "--rdzv-endpoint", endpoint, *NO_DROPOUT], _env(tmp_path))
            for r in (0, 1)
        ],
        meanwhile=lambda: _train_here(
            tmp_path, "full", *NO_DROPOUT, "train_dataloader.batch_size=16", monkeypatch=monkeypatch
        ),
    )
    for a, b in zip(nodes, two_process_run()):
        _assert_equal(a, b)
    _assert_equal(_weights(tmp_path / "full", 1)[0], two_process_run()[0], atol=1e-6)


@pytest.mark.timeout(600)
def test_srun_tasks_without_torchrun_equal_one_two_process_launch(
    tmp_path: Path, two_process_run: Callable[[], list]
) -> None:
    """``srun --ntasks=2 trainwright train CFG``: each task reads SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID,
    MASTER_ADDR from the node list."""
    port = str(_free_port())
    slurm = dict(
        SLURM_JOB_ID="77",
        SLURM_NTASKS="2",
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="127.0.0.1,127.0.0.2",
        MASTER_PORT=port,
    )
    envs = [_env(tmp_path, **slurm, SLURM_PROCID=str(r), SLURM_NODEID=str(r), SLURM_LOCALID="0") for r in (0, 1)]
    for a, b in zip(_together(tmp_path, [(list(NO_DROPOUT), e) for e in envs]), two_process_run()):
        _assert_equal(a, b)
    assert [torch.load(tmp_path / "w" / f"result_rank{r}.pt", weights_only=True)["torchrun"] for r in (0, 1)] == [
        False,
        False,
    ]  # srun started them


@pytest.mark.timeout(600)
def test_kubernetes_pytorchjob_pods_equal_one_two_process_launch(
    tmp_path: Path, two_process_run: Callable[[], list]
) -> None:
    """Two pods of a PyTorchJob (MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK and PET_*): ``trainwright train CFG``
    starts torchrun from PET_*."""
    port = str(_free_port())
    pod = dict(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        WORLD_SIZE="2",
        PET_NNODES="2",
        PET_NPROC_PER_NODE="1",
        PET_MASTER_ADDR="127.0.0.1",
        PET_MASTER_PORT=port,
    )
    envs = [_env(tmp_path, **pod, RANK=str(r), PET_NODE_RANK=str(r)) for r in (0, 1)]
    launches = [(list(NO_DROPOUT), e) for e in envs]
    for a, b in zip(_together(tmp_path, launches), two_process_run()):
        _assert_equal(a, b)
    assert [torch.load(tmp_path / "w" / f"result_rank{r}.pt", weights_only=True)["torchrun"] for r in (0, 1)] == [
        True,
        True,
    ]
