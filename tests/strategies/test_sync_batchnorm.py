"""``DDPStrategy(sync_batchnorm=True)`` / mmengine's ``sync_bn='torch'``: BatchNorm layers become torch's
SyncBatchNorm; refused at start where torch cannot run it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from launch import launch
from torch import nn

import trainwright as tw
from trainwright.config import ConfigError
from trainwright.strategies.ddp import DDPStrategy

SCRIPT = Path(__file__).with_name("syncbn_train.py")


def test_conversion_keeps_the_parameters_and_buffers() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.BatchNorm1d(8), nn.ReLU()), nn.BatchNorm1d(8))
    before = dict(model.named_parameters()) | dict(model.named_buffers())
    DDPStrategy(device="cpu", sync_batchnorm=True).parallelize(model)
    assert [type(m).__name__ for m in model.modules()].count("SyncBatchNorm") == 2
    after = dict(model.named_parameters()) | dict(model.named_buffers())
    assert after.keys() == before.keys() and all(
        after[k] is v for k, v in before.items()
    )  # an optimizer built before still holds them


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cpu_processes_are_refused_at_start_with_the_fix(tmp_path: Path) -> None:
    out = launch(SCRIPT, [str(tmp_path), "cpu"], tmp_path, nproc=2, timeout=150)
    for rank in (0, 1):
        assert (
            f"rank {rank}: SyncBatchNorm runs on CUDA, XPU or HPU only (torch's DDP refuses it on cpu), and the model "
            "has 1 SyncBatchNorm layer(s), e.g. 'bn'" in out.output
        ), out.output[-3000:]
    assert "add SyncBuffersHook to average the running statistics" in out.output


@pytest.mark.cuda
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_one_cuda_process_trains_as_with_batchnorm(tmp_path: Path) -> None:
    launch(SCRIPT, [str(tmp_path), "cuda"], tmp_path, nproc=1, torchrun=("--standalone", "--nnodes=1"), timeout=240)
    saved = torch.load(tmp_path / "one.pt")
    assert "SyncBatchNorm" in saved["types"] and "BatchNorm1d" not in saved["types"]
    for k, v in saved[
        "plain"
    ].items():  # one process: SyncBatchNorm normalises with the batch's own statistics, as BatchNorm does
        torch.testing.assert_close(saved["synced"][k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_sync_bn_takes_torchs_implementation_only_and_one_process_needs_none(tmp_path: Path) -> None:
    cfg = dict(model=nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), work_dir=str(tmp_path), log_level="WARNING")
    with pytest.raises(
        ConfigError,
        match=r"sync_bn='mmcv' is not supported: trainwright converts to torch's SyncBatchNorm, sync_bn='torch'",
    ):
        tw.Trainer.from_config({**cfg, "sync_bn": "mmcv"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one process: nothing to synchronise, as in mmengine
        trainer = tw.Trainer.from_config({**cfg, "sync_bn": "torch"})
    assert trainer.strategy.name == "single"
    trainer.close()
