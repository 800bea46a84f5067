"""Restores that explain themselves (issue 39 item 5): what is not built yet, which checkpoint was skipped and why,
and a mid-epoch resume with a train loader of another shape named whatever follows."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw


def _trainer(work: Path, batch_size: int = 2, max_epochs: int = 1, **kwargs: Any) -> tw.Trainer:
    kwargs.setdefault("default_hooks", dict(checkpoint=dict(by_epoch=False, interval=2)))
    return tw.Trainer(
        model=LinearReg(),
        work_dir=work,
        train_dataloader=DataLoader(regression_set(16), batch_size=batch_size),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        randomness=dict(seed=0),
        log_level="INFO",
        **kwargs,
    )


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """iter_2 ... iter_8 of one epoch of 8 batches (iter_6 is in the middle of the epoch)."""
    work = tmp_path_factory.mktemp("run")
    with _trainer(work) as t:
        t.train()
    return work / "checkpoints"


def _log(t: tw.Trainer) -> str:
    t.flush_logs()
    return (t.run_dir / "train.log").read_text()


def test_find_and_restore_before_train_says_what_is_not_ready(ckpts: Path, tmp_path: Path) -> None:
    with _trainer(tmp_path, default_hooks=dict(checkpoint=None)) as t:
        before = [p.detach().clone() for p in t.model.parameters()]
        with pytest.raises(RuntimeError) as e:
            t.checkpoints.find_and_restore(ckpts / "iter_6.pth")
        assert "does not fit" not in str(e.value)
        assert re.search(
            r"Cannot restore checkpoint '.*iter_6\.pth' yet: this trainer's model is not prepared yet .*"
            r"nothing was loaded\. Pass resume= to the Trainer .* or call trainer\.build_train_loop\(\) first",
            str(e.value),
        ), str(e.value)
        assert all(torch.equal(a, b) for a, b in zip(before, t.model.parameters()))  # nothing was loaded
        assert t.progress.iteration == 0
        t.build_train_loop()  # what the message says: now it restores
        t.checkpoints.find_and_restore(ckpts / "iter_6.pth")
        assert t.progress.iteration == 6 and t.progress.iter_in_epoch == 6


def test_a_resume_logs_the_newer_checkpoint_it_skipped_and_why(ckpts: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "checkpoints").mkdir(parents=True)
    for name in ("iter_6.pth", "iter_8.pth"):
        (work / "checkpoints" / name).write_bytes((ckpts / name).read_bytes())
    data = (work / "checkpoints" / "iter_8.pth").read_bytes()
    (work / "checkpoints" / "iter_8.pth").write_bytes(data[: len(data) // 2])  # truncated: a disk that filled up
    with _trainer(work, max_epochs=2, resume=True) as t, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loader's own "Skipping checkpoint" warning
        t.train()
        log = _log(t)
    assert t.progress.iteration == 16  # resumed from iter_6, not from scratch
    assert re.search(
        r"WARNING - Resumed from .*iter_6\.pth, not from the newer iter_8\.pth \(skipped: Cannot read checkpoint "
        r"'.*iter_8\.pth': .*truncated or corrupt",
        log,
    ), log


def test_a_mid_epoch_resume_into_a_shorter_epoch_says_the_epoch_is_over(ckpts: Path, tmp_path: Path) -> None:
    # the same max_epochs: nothing is left, and the message says it is the loader's shape, not a finished run
    with _trainer(tmp_path / "a", batch_size=4, resume=ckpts / "iter_6.pth") as t:
        t.train()
        log = _log(t)
    assert t.progress.iteration == 6
    shape = "batch_size 2 in the checkpoint, 4 now, batches 8 in the checkpoint, 4 now"
    assert (
        f"train_dataloader of another shape: {shape}. The new loader has 4 batches per epoch, so epoch 1 is already "
        "over: the rest of its samples are skipped" in log
    ), log
    assert re.search(
        r"Nothing to train: training is complete at iteration 6 of max_iters 4 .*The checkpoint was written in the "
        rf"middle of an epoch with a train_dataloader of another shape \({shape}\): max_iters 4 counts this loader's",
        log,
    ), log
    # one more epoch: it is trained, after the same warning
    with _trainer(tmp_path / "b", batch_size=4, max_epochs=2, resume=ckpts / "iter_6.pth") as t:
        t.train()
        log = _log(t)
    assert "so epoch 1 is already over" in log and "Nothing to train" not in log
    assert t.progress.iteration == 10 and t.progress.epoch == 2
