"""Background checkpoint writes: snapshot isolation, one write at a time, errors surface, same files."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from trainwright.checkpoint import load_file, read_latest
from trainwright.checkpoint.async_writer import AsyncCheckpointWriter, snapshot

import chaos_train as ct


def test_snapshot_is_isolated_from_later_training_steps(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 3)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    release = threading.Event()
    w = AsyncCheckpointWriter()
    w.submit({"model": model.state_dict()}, tmp_path / "a.pth", after=release.wait)
    with torch.no_grad():  # the next "optimizer step" changes the weights in place
        model.weight.add_(1.0)
        model.bias.zero_()
    release.set()
    w.wait()
    got = load_file(tmp_path / "a.pth")["model"]
    for k, v in expected.items():
        assert torch.equal(got[k], v), k


def test_snapshot_keeps_state_dict_metadata() -> None:
    sd = torch.nn.BatchNorm1d(3).state_dict()
    snap = snapshot(sd)
    assert type(snap) is type(sd) and snap._metadata == sd._metadata  # type: ignore[attr-defined]
    assert all(snap[k].data_ptr() != v.data_ptr() for k, v in sd.items() if v.numel())


def test_at_most_one_write_in_flight(tmp_path: Path) -> None:
    release = threading.Event()
    w = AsyncCheckpointWriter()
    w.submit({"x": torch.zeros(2)}, tmp_path / "1.pth", after=release.wait)
    assert w.pending
    done = threading.Event()

    def second() -> None:
        w.submit({"x": torch.ones(2)}, tmp_path / "2.pth")
        done.set()

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.2)
    assert not done.is_set(), "a second write started while the first was still in flight"
    release.set()
    t.join(5)
    assert done.is_set()
    w.wait()
    assert torch.equal(load_file(tmp_path / "2.pth")["x"], torch.ones(2))


def test_write_error_is_raised_by_wait_and_leaves_no_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the checkpoint directory should be")
    w = AsyncCheckpointWriter()
    ran = []
    w.submit({"x": torch.zeros(1)}, blocker / "a.pth", after=lambda: ran.append(1))
    with pytest.raises(OSError, match="previous checkpoint and `latest` are as they were") as e:  # the real cause, with the path
        w.wait()
    assert e.value.filename == str(blocker / "a.pth")
    assert ran == []  # the pointer / deletions never run after a failed write
    w.wait()  # the error is reported once


def test_async_and_sync_runs_write_the_same_checkpoints(tmp_path: Path) -> None:
    for mode in ("sync", "async"):
        ct.build(str(tmp_path / mode), async_save=mode == "async", checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=3)).train()
    names = {p.name for p in (tmp_path / "sync" / "checkpoints").iterdir()}
    assert names == {p.name for p in (tmp_path / "async" / "checkpoints").iterdir()}
    assert read_latest(tmp_path / "async" / "checkpoints") == read_latest(tmp_path / "sync" / "checkpoints")
    from test_chaos import _assert_same_tensors

    for name in names - {"latest"}:
        a = load_file(tmp_path / "sync" / "checkpoints" / name)
        b = load_file(tmp_path / "async" / "checkpoints" / name)
        a.pop("meta"), b.pop("meta")
        a.pop("metric_store"), b.pop("metric_store")  # holds iteration times (the logger hook keeps no copy)
        _assert_same_tensors(a, b, name)
