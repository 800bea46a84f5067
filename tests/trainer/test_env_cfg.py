"""mmengine's ``env_cfg``: cudnn benchmark, the multiprocessing start method, the process group's backend and
timeout, the open-files limit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

import trainwright as tw

SCRIPT = """
import sys, warnings
from torch import nn
import trainwright as tw
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    t = tw.Trainer(model=nn.Linear(2, 1), work_dir=sys.argv[1], strategy="ddp", log_level="WARNING",
                   env_cfg=dict(dist_cfg=dict(backend=sys.argv[2], timeout=77)))
print(t.strategy.backend, t.strategy.timeout_s, [str(w.message) for w in caught if "env_cfg" in str(w.message)])
t.close()
"""


def _one_process_ddp(tmp_path: Path, backend: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TMPDIR=str(tmp_path),
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), backend], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_dist_cfg_sets_the_process_groups_backend_and_timeout(tmp_path: Path) -> None:
    assert _one_process_ddp(tmp_path / "gloo", "gloo") == "gloo 77.0 []"
    # a runtime config written for GPUs (mmengine's default_runtime: backend='nccl') still runs on CPU, with a warning
    backend, timeout, message = _one_process_ddp(tmp_path / "nccl", "nccl").split(" ", 2)
    assert (backend, timeout) == ("gloo", "77.0") and "backend='nccl' needs CUDA" in message


def test_cudnn_benchmark_and_the_start_method(tmp_path: Path) -> None:
    before = (torch.backends.cudnn.benchmark, mp.get_start_method(allow_none=True))
    try:
        t = tw.Trainer(
            model=nn.Linear(2, 1),
            work_dir=tmp_path,
            log_level="WARNING",
            env_cfg=dict(cudnn_benchmark=True, mp_cfg=dict(mp_start_method="spawn", opencv_num_threads=0)),
        )
        assert torch.backends.cudnn.benchmark is True and mp.get_start_method() == "spawn"
        t.close()
    finally:
        torch.backends.cudnn.benchmark = before[0]
        mp.set_start_method(before[1], force=True)


def test_an_unknown_env_cfg_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="cudnn_benchmark"):
        tw.Trainer(model=nn.Linear(2, 1), work_dir=tmp_path, env_cfg=dict(cudnn_benchmrk=True))
    with pytest.raises(KeyError, match="mp_start_method"):
        tw.Trainer(model=nn.Linear(2, 1), work_dir=tmp_path, env_cfg=dict(mp_cfg=dict(start_method="spawn")))


def test_resource_limit_raises_the_open_files_soft_limit_as_mmengine(tmp_path: Path) -> None:
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard limit of open files is {hard}")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1000, hard))
        tw.Trainer(model=nn.Linear(2, 1), work_dir=tmp_path, env_cfg=dict(resource_limit=2048)).close()
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (2048, hard)
        tw.Trainer(model=nn.Linear(2, 1), work_dir=tmp_path, env_cfg=dict(resource_limit=1500)).close()
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (2048, hard)  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
