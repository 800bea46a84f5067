"""After a crash ``train.log`` ends with the reason; a refused job leaves no run folder (issue #27, items 11 and 7).

Before: the held log lines were written after the error (``tail train.log`` showed training
lines), the error's "epoch" counted completed epochs (0 in the first) while the lines number
epochs from 1, and a job refused at ``train()`` (``WorkDirBusyError``) left a run folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.checkpoint import WorkDirBusyError, WorkDirLock


class RaiseAt(tw.Hook):
    def __init__(self, at: int) -> None:
        self.at = at

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        if trainer.progress.iteration == self.at:
            raise ValueError(f"boom at {self.at}")


def _trainer(tmp_path: Path, **kw: Any) -> tw.Trainer:
    """5 iterations per epoch; lines every 2 iterations, held for an hour (written at epoch ends and when the run
    ends)."""
    args: dict[str, Any] = dict(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(regression_set(20), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(logger=dict(interval=2, flush_secs=3600.0), checkpoint=None),
        randomness=dict(seed=0),
    )
    args.update(kw)
    return tw.Trainer(**args)


def test_after_a_crash_the_reason_is_the_last_line_of_train_log(tmp_path: Path) -> None:
    t = _trainer(tmp_path, custom_hooks=[RaiseAt(9)])
    with t, pytest.raises(ValueError, match="boom at 9"):
        t.train()
    lines = (t.run_dir / "train.log").read_text().splitlines()
    assert lines[-1].endswith(
        "ERROR - Stopped by ValueError at epoch 2, iteration 9: boom at 9"
    )  # epoch 2: as the lines number it
    held = [
        i for i, line in enumerate(lines) if "Epoch(train) [2][2/5]" in line
    ]  # the line of iteration 7 (the epoch's 2nd), held when the hook raised
    assert len(held) == 1 and held[0] < len(lines) - 1
    assert any(
        "Traceback (most recent call last)" in line for line in lines[held[0] :]
    )  # the traceback, after the lines, before the reason


class InterruptAt(tw.Hook):
    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        if trainer.progress.iteration == 3:
            raise KeyboardInterrupt  # Ctrl-C: an exception without a message


def test_an_exception_without_a_message_ends_the_reason_without_a_dangling_colon(tmp_path: Path) -> None:
    t = _trainer(tmp_path, custom_hooks=[InterruptAt()], train_cfg=dict(by_epoch=False, max_iters=20))
    with t, pytest.raises(KeyboardInterrupt):
        t.train()
    assert (
        (t.run_dir / "train.log")
        .read_text()
        .splitlines()[-1]
        .endswith("ERROR - Stopped by KeyboardInterrupt at iteration 3")
    )


def test_the_reason_names_the_iteration_of_an_iteration_based_run_as_its_lines(tmp_path: Path) -> None:
    t = _trainer(tmp_path, custom_hooks=[RaiseAt(7)], train_cfg=dict(by_epoch=False, max_iters=20))
    with t, pytest.raises(ValueError):
        t.train()
    lines = (t.run_dir / "train.log").read_text().splitlines()
    assert lines[-1].endswith("ERROR - Stopped by ValueError at iteration 7: boom at 7")
    assert any("Iter(train) [ 6/20]" in line for line in lines)


def test_an_error_between_epochs_names_the_epoch_just_completed(tmp_path: Path) -> None:
    class RaiseAfterEpoch(tw.Hook):
        def after_train_epoch(self, trainer: Any) -> None:
            if trainer.progress.epoch == 2:
                raise RuntimeError("epoch hook broke")

    t = _trainer(tmp_path, custom_hooks=[RaiseAfterEpoch()])
    with t, pytest.raises(RuntimeError):
        t.train()
    lines = (t.run_dir / "train.log").read_text().splitlines()
    assert lines[-1].endswith("Stopped by RuntimeError at epoch 2, iteration 10: epoch hook broke")
    assert any("Epoch(train) [2][5/5]" in line for line in lines)


def test_a_refused_job_leaves_no_run_folder(tmp_path: Path) -> None:
    other = WorkDirLock(tmp_path / "checkpoints")  # another live job trains in this work_dir
    other.acquire()
    try:
        t = _trainer(tmp_path)
        assert t.run_dir.is_dir()
        with t, pytest.raises(WorkDirBusyError, match="Another run is training"):
            t.train()
        assert not t.run_dir.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]
        # a run folder named by the user may hold an earlier run's files: it is left as it is
        (tmp_path / "named").mkdir()
        (tmp_path / "named" / "notes.txt").write_text("mine")
        t = _trainer(tmp_path, experiment_name="named")
        with t, pytest.raises(WorkDirBusyError):
            t.train()
        assert (tmp_path / "named" / "notes.txt").read_text() == "mine" and (tmp_path / "named" / "train.log").is_file()
    finally:
        other.release()
    t = _trainer(tmp_path)  # once the other job is gone, training goes on as usual
    with t:
        t.train()
    assert (t.run_dir / "train.log").is_file()
