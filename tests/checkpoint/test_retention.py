"""Retention that never fills the disk (issue 39 item 4): thinning to weights, the free-space preflight, a truncated
checkpoint never resumed from."""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.checkpoint.local_store import LocalStore
from trainwright.checkpoint.retention import CheckpointSpaceError
from trainwright.hooks.hook import Hook


class Reg(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor, mode: str = "tensor") -> Any:  # noqa: D102
        out = self.lin(x)
        return {"loss": ((out - y) ** 2).mean()} if mode == "loss" else out


class Weights(Hook):
    """The model's weights after every iteration."""

    def __init__(self) -> None:
        self.at: dict[int, dict[str, torch.Tensor]] = {}

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        self.at[trainer.progress.iteration] = {k: v.clone() for k, v in trainer.model.state_dict().items()}


def _trainer(work: Path, max_iters: int = 25, hooks: list[Hook] | None = None, **checkpoint: Any) -> tw.Trainer:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    return tw.Trainer(
        model=Reg(),
        work_dir=work,
        train_dataloader=DataLoader(data, batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(checkpoint=dict(by_epoch=False, interval=1, **checkpoint)),
        custom_hooks=hooks or [],
        randomness=dict(seed=0),
        resume=True,
        log_level="INFO",
    )


def _files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and not p.name.startswith(".")}


def test_thinning_keeps_exactly_the_promised_files_and_a_truncated_one_is_skipped(tmp_path: Path) -> None:
    weights = Weights()
    with _trainer(tmp_path, hooks=[weights], keep=dict(last=3, weights_every=10)) as t:
        t.train()
    ckpts = tmp_path / "checkpoints"
    assert _files(ckpts) == {
        "iter_23.pth",
        "iter_24.pth",
        "iter_25.pth",
        "latest",
        "weights/iter_10.pth",
        "weights/iter_20.pth",
    }
    for n in (10, 20):
        thin = torch.load(ckpts / "weights" / f"iter_{n}.pth", weights_only=True)
        assert sorted(thin) == ["meta", "model"]
        assert thin["model"].keys() == weights.at[n].keys()
        assert all(torch.equal(thin["model"][k], v) for k, v in weights.at[n].items())  # bitwise the weights then

    data = (ckpts / "iter_25.pth").read_bytes()
    (ckpts / "iter_25.pth").write_bytes(data[: len(data) * 2 // 3])  # cut: the disk filled up mid-copy
    with _trainer(tmp_path, max_iters=26, keep=dict(last=3, weights_every=10)) as t, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loader's own "Skipping checkpoint" warning
        t.train()
        t.flush_logs()
        log = (t.run_dir / "train.log").read_text()
    assert t.checkpoints.restored is not None and t.checkpoints.restored[0] == ckpts / "iter_24.pth"
    assert re.search(r"Resumed from .*iter_24\.pth, not from the newer iter_25\.pth \(skipped: .*truncated", log), log


def test_max_keep_ckpts_and_keep_last_agree_and_conflicts_are_refused(tmp_path: Path) -> None:
    with _trainer(tmp_path, max_iters=5, max_keep_ckpts=2) as t:
        t.train()
    assert _files(tmp_path / "checkpoints") == {"iter_4.pth", "iter_5.pth", "latest"}
    with pytest.raises(ValueError, match=r"keep=.* and max_keep_ckpts=3 disagree"):
        _trainer(tmp_path / "b", max_keep_ckpts=3, keep=dict(last=2))
    with pytest.raises(ValueError, match=r"weights_every=5 needs last=k"):
        _trainer(tmp_path / "c", keep=dict(weights_every=5))


class TinyDisk(LocalStore):
    """A folder that reports ``free`` bytes free (the Store's free-space seam)."""

    def __init__(self, root: Path, free: int = 50) -> None:
        super().__init__(root)
        self.free = free

    def free_bytes(self, url: str) -> int | None:  # noqa: D102
        return self.free


def test_the_preflight_refuses_a_run_that_cannot_fit_before_training(tmp_path: Path) -> None:
    assert 0 < LocalStore(tmp_path).free_bytes(str(tmp_path / "not" / "yet")) <= shutil.disk_usage(tmp_path).total
    weights = Weights()
    with _trainer(tmp_path, hooks=[weights], out_dir=TinyDisk(tmp_path / "disk"), keep=dict(last=3)) as t:
        with pytest.raises(CheckpointSpaceError) as e:
            t.train()
    msg = str(e.value)
    assert weights.at == {}  # not one iteration trained
    assert not (tmp_path / "disk").exists() or not any((tmp_path / "disk").iterdir())  # nothing written
    # the numbers: one checkpoint (5 float weights = 20 B; SGD's momentum is made at its first step), 4 of them
    # (3 kept + 1 being written)
    assert re.search(
        r"one holds about 20 B \(its tensors; the weights 20 B\), .*needs 80 B more, but only 50 B are free", msg
    ), msg
    assert "keep fewer" in msg and "out_dir on a larger disk" in msg and str(tmp_path / "disk") in msg


def test_the_second_save_checks_again_with_the_real_size(tmp_path: Path) -> None:
    # before training the estimate is the weights (20 B: SGD's momentum does not exist yet) x 4 = 80 B <= 1,500 B;
    # after the second save, the newest file's real size (a few KiB) x the 2 more that last=3 (+ 1) needs does not
    # fit
    weights = Weights()
    disk = TinyDisk(tmp_path / "disk", free=1500)
    with _trainer(tmp_path, hooks=[weights], out_dir=disk, keep=dict(last=3)) as t:
        with pytest.raises(CheckpointSpaceError) as e:
            t.train()
    assert max(weights.at) == 2  # stopped at the second save
    assert sorted(p.name for p in (tmp_path / "disk").glob("iter_*.pth")) == ["iter_1.pth", "iter_2.pth"]  # kept
    msg = str(e.value)
    assert re.search(
        r"one holds about \d+\.\d KiB \(the newest on disk; the weights 20 B\), "
        r".*\(\+ 1 being written; 2 on disk already\) needs \d+\.\d KiB more, but only "
        r"1\.5 KiB are free\. Training stopped at iteration 2; the checkpoints written so far are kept",
        msg,
    ), msg


def test_the_size_of_sharded_tensors_counts_their_whole_size_and_tied_ones_once(tmp_path: Path) -> None:
    # an FSDP2 model's state holds DTensors, which have no storage of their own: the preflight of every FSDP run with
    # a checkpoint hook failed ("invalid python storage")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from trainwright.checkpoint.retention import tensor_bytes

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = distribute_tensor(torch.ones(4, 3), mesh, [Shard(0)])
        plain = torch.zeros(2, dtype=torch.float64)
        assert tensor_bytes({"model": {"w": sharded, "tied": sharded}, "optim": [plain, plain]}) == 48 + 16
    finally:
        dist.destroy_process_group()
