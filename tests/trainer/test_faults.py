"""Faults a run must survive without losing data, hanging or going silent (issue: "No silent failures").

Each test makes the fault happen for real (a full disk is a tiny tmpfs, a second run is a
second process, a signal is a signal) and checks what a user sees: the message names the
problem and the fix, nothing on disk is lost, no process is left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.logging import JsonlWriter


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A real filesystem of 256 KiB (tmpfs), so that "disk full" is the kernel's ENOSPC; skipped where mounting is not allowed."""
    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; returns the filler file."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = b"\0" * 4096
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0")
        except OSError:
            pass
    return filler


def test_disk_full_while_logging_warns_at_once_tears_no_line_and_training_goes_on(tiny_disk: Path):
    """The audit saw lines dropped silently, a torn last line in metrics.jsonl and the error only at the end."""
    seen: list = []
    at_refill: dict[str, int] = {}

    class DiskWeather(tw.Hook):
        def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
            it = trainer.progress.iteration
            if it == 10:
                _fill(tiny_disk)
            if it == 60:
                at_refill["warnings"] = sum("metrics.jsonl" in str(w.message) for w in seen)
                (tiny_disk / "filler").unlink()

    jsonl = tiny_disk / "run" / "metrics.jsonl"
    t = tw.Trainer(
        model=LinearReg(), work_dir=tiny_disk, experiment_name="run", train_dataloader=DataLoader(regression_set(80), batch_size=1),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)), train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=None, logger=dict(interval=1, flush_secs=0)), custom_hooks=[DiskWeather()],
        writers=["console", JsonlWriter(jsonl, flush_secs=0)], randomness=dict(seed=0),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = caught
        try:
            t.train()
        finally:
            t.close()
    messages = [str(w.message) for w in caught]
    assert t.progress.iteration == 80  # training went on
    assert at_refill["warnings"] >= 1  # reported while the disk was full, not at the end
    assert any(f"Could not write" in m and str(jsonl) in m and "No space left on device" in m and "free space" in m for m in messages)
    assert any("works again" in m and str(jsonl) in m for m in messages)
    text = jsonl.read_text()
    assert text.endswith("\n")
    iters = [json.loads(line)["iter"] for line in text.splitlines()]  # every line is whole JSON
    assert iters[:9] == list(range(1, 10)) and iters[-1] == 80 and iters == sorted(iters)
    assert (tiny_disk / "run" / "train.log").read_text().endswith("\n")


def test_trainers_hold_no_file_descriptors_after_their_runs(tmp_path: Path):
    """The audit's 60th Trainer in one process failed with "Too many open files": each leaked its train.log."""

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def one_run(i: int) -> None:
        t = tw.Trainer(model=LinearReg(), work_dir=tmp_path, experiment_name=f"r{i}", train_dataloader=DataLoader(regression_set(8), batch_size=4),
                       optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)), train_cfg=dict(by_epoch=True, max_epochs=1),
                       default_hooks=dict(checkpoint=None), log_level="WARNING")
        t.train()

    one_run(0)  # imports, thread pools and the like open what they keep for good
    before = open_fds()
    for i in range(1, 6):
        one_run(i)
    assert open_fds() == before
    assert all((tmp_path / f"r{i}" / "train.log").is_file() for i in range(6))
