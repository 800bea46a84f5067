"""Bounded launches for the multi-process tests: torchrun (or one plain python process) in the gloo test environment.

Output goes to a log file, not a pipe (a worker left behind cannot block the read); on a
timeout torchrun gets SIGTERM (it stops its workers), then SIGKILL, and the test fails with
the log's tail, so a hung worker never outlives its test.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


_GLOO_VARS = {"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def gloo_env(tmp: Path) -> dict[str, str]:
    """This process's environment for a child run: TMPDIR in ``tmp``, one thread per process, no launcher variables
    inherited."""
    env = dict(os.environ, TMPDIR=str(tmp), **_GLOO_VARS)
    for k in _LAUNCH_VARS:
        env.pop(k, None)
    return env


def use_gloo_env(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    """The same environment for processes this test starts itself (``torch.multiprocessing.spawn``), undone after the
    test."""
    for k, v in {"TMPDIR": str(tmp), **_GLOO_VARS}.items():
        monkeypatch.setenv(k, v)
    for k in _LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)


@contextmanager
def gloo_group(rank: int, init_file: str, world_size: int) -> Iterator[None]:
    """A ``torch.multiprocessing.spawn`` worker's gloo group (file rendezvous, one thread), torn down in order even when
    the body fails.

    Teardown: garbage-collect first (a Trainer's DDP wrapper must not outlive the group), a
    barrier (no rank destroys the group while another still uses it), then destroy it.
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        yield
    finally:
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


@dataclass
class Launched:
    """A finished launch: its exit status and its combined stdout / stderr."""

    returncode: int
    output: str


def launch(
    script: Path,
    args: list[str],
    tmp: Path,
    *,
    nproc: int,
    torchrun: tuple[str, ...] = ("--standalone",),
    timeout: float = 180,
    check: bool = True,
) -> Launched:
    """``torchrun TORCHRUN --nproc_per_node=NPROC script ARGS`` (plain python for one standalone process), bounded by
    ``timeout``."""
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", *torchrun, f"--nproc_per_node={nproc}"]
        if nproc > 1 or torchrun != ("--standalone",)
        else [sys.executable]
    )
    log = tmp / f"launch_{len(list(tmp.glob('launch_*.log')))}.log"
    with log.open("w") as f:
        proc = subprocess.Popen([*launcher, str(script), *args], env=gloo_env(tmp), stdout=f, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # torchrun stops its workers on SIGTERM
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            pytest.fail(f"{script.name} {' '.join(args)} did not finish within {timeout} s:\n{log.read_text()[-6000:]}")
    out = Launched(proc.returncode, log.read_text())
    if check:
        assert out.returncode == 0, out.output[-8000:]
    return out
