"""mmengine's ``model_wrapper_cfg=dict(type='MMDistributedDataParallel', ...)``: the DDP strategy's arguments, under
DDP only."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from torch import nn

import trainwright as tw
from trainwright.config import ConfigError

SCRIPT = """
import sys, torch
from torch import nn
import trainwright as tw
t = tw.Trainer.from_config(dict(model=nn.Linear(2, 1), work_dir=sys.argv[1], strategy="ddp", log_level="WARNING",
                                model_wrapper_cfg=dict(type="MMDistributedDataParallel", find_unused_parameters=True, detect_anomalous_params=True)))
print(type(t.strategy).__name__, t.strategy.ddp_kwargs, t.strategy.detect_anomalous_params)
t.close()
# mmengine's top-level find_unused_parameters (25 mmpretrain configs), used when there is no model_wrapper_cfg
t = tw.Trainer.from_config(dict(model=nn.Linear(2, 1), work_dir=sys.argv[1], strategy="ddp", log_level="WARNING", find_unused_parameters=True))
print(t.strategy.ddp_kwargs)
t.close()
# mmagic's GAN wrapper: the same strategy, with that wrapper's broadcast_buffers=False
t = tw.Trainer.from_config(dict(model=nn.Linear(2, 1), work_dir=sys.argv[1], strategy="ddp", log_level="WARNING",
                                model_wrapper_cfg=dict(type="MMSeparateDistributedDataParallel", find_unused_parameters=True)))
print(t.strategy.ddp_kwargs)
t.close()
"""


def test_a_ddp_run_takes_the_wrappers_arguments(tmp_path: Path) -> None:
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
        [sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-3:] == [
        "DDPStrategy {'find_unused_parameters': True} True",
        "{'find_unused_parameters': True}",
        "{'find_unused_parameters': True, 'broadcast_buffers': False}",
    ]


def test_one_process_needs_no_wrapper_and_other_wrappers_are_refused(tmp_path: Path) -> None:
    cfg = dict(
        model=nn.Linear(2, 1),
        work_dir=str(tmp_path),
        log_level="WARNING",
        model_wrapper_cfg=dict(type="MMDistributedDataParallel", find_unused_parameters=True),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not "ignored" any more: no warning
        t = tw.Trainer.from_config(cfg)
    assert t.strategy.name == "single"  # one process: no DDP wrapper, as in mmengine
    t.close()
    with pytest.raises(
        ConfigError, match=r"model_wrapper_cfg type='MMFullyShardedDataParallel'.*strategy=dict\(type='fsdp'"
    ):
        tw.Trainer.from_config({**cfg, "model_wrapper_cfg": dict(type="MMFullyShardedDataParallel")})
    with pytest.raises(ConfigError, match=r"model_wrapper_cfg keys \['bucket_size'\]"):
        tw.Trainer.from_config({**cfg, "model_wrapper_cfg": dict(type="MMDistributedDataParallel", bucket_size=3)})
