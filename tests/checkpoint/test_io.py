"""Checkpoint files: complete-or-absent writes, safe loading, and picking what to resume from."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from trainwright.checkpoint import (
    CheckpointError,
    UnsafeCheckpointError,
    atomic_save,
    atomic_write_text,
    find_resumable,
    list_checkpoints,
    load_file,
    read_latest,
    save_safetensors,
    write_latest,
)


def _ckpt(step: int) -> dict:
    return {"step": step, "w": torch.full((8, 4), float(step)), "meta": {"name": f"s{step}", "lrs": [0.1, 0.01]}}


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert a["step"] == b["step"] and a["meta"] == b["meta"]
    assert torch.equal(a["w"], b["w"])


def _temp_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if ".tmp." in p.name)


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("serialisation failed half-way")


class _Payload:
    """Unpickling this creates a file: proof of code execution if it ever appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


# --------------------------------------------------------------------------- atomic writes


def test_atomic_save_round_trips_and_creates_parent_dirs(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "epoch_1.pth"
    atomic_save(_ckpt(1), target)
    _assert_same(load_file(target), _ckpt(1))
    # What torch itself reads back, with the safe loader, is the same.
    _assert_same(torch.load(target, weights_only=True), _ckpt(1))
    assert _temp_files(target.parent) == []


@pytest.mark.parametrize("bad", [{"f": lambda: 0}, {"w": torch.ones(1000), "x": _Unpicklable()}])
def test_failed_serialisation_keeps_previous_checkpoint_and_leaves_no_temp(tmp_path: Path, bad: dict) -> None:
    target = tmp_path / "epoch_1.pth"
    atomic_save(_ckpt(1), target)
    before = target.read_bytes()
    with pytest.raises(Exception):  # noqa: B017 (whatever the pickler raises for this object: the point is what is left on disk)
        atomic_save({**_ckpt(2), **bad}, target)
    assert target.read_bytes() == before
    _assert_same(load_file(target), _ckpt(1))
    assert _temp_files(tmp_path) == []


def test_failed_rename_keeps_previous_checkpoint_and_leaves_no_temp(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "epoch_1.pth"
    atomic_save(_ckpt(1), target)

    def refuse(src, dst):  # inject an OS failure (e.g. EXDEV, quota) at the last step
        raise OSError("injected rename failure")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="injected"):
        atomic_save(_ckpt(2), target)
    monkeypatch.undo()
    _assert_same(load_file(target), _ckpt(1))
    assert _temp_files(tmp_path) == []


def test_atomic_write_text_replaces_content(tmp_path: Path) -> None:
    p = tmp_path / "note"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert _temp_files(tmp_path) == []


def _save_forever(target: str, tensors: list[torch.Tensor], ready) -> None:
    ready.set()
    step = 0
    while True:
        atomic_save({"step": step, "w": tensors[step % 2]}, target)
        step += 1


@pytest.mark.skipif(sys.platform == "win32" or "fork" not in mp.get_all_start_methods(), reason="needs fork")
@pytest.mark.timeout(120)
def test_sigkill_during_save_leaves_target_absent_or_complete(tmp_path: Path) -> None:
    """kill -9 at several moments of a stream of large saves: the target always loads."""
    tensors = [torch.zeros(4_000_000), torch.ones(4_000_000)]  # 16 MB each
    target = tmp_path / "iter_1.pth"
    ctx = mp.get_context("fork")
    killed_mid_write = 0
    for delay in (0.0, 0.01, 0.03, 0.06, 0.1, 0.2, None, 0.3):
        before = set(_temp_files(tmp_path))
        ready = ctx.Event()
        proc = ctx.Process(target=_save_forever, args=(str(target), tensors, ready))
        proc.start()
        assert ready.wait(30)
        if delay is None:  # make sure a kill also lands after at least one completed save
            deadline = time.monotonic() + 30
            while not target.exists() and time.monotonic() < deadline:
                time.sleep(0.005)
            delay = 0.05
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL
        killed_mid_write += bool(set(_temp_files(tmp_path)) - before)
        if target.exists():
            ckpt = load_file(target)
            assert torch.equal(ckpt["w"], tensors[ckpt["step"] % 2])
            # Leftover temp files of killed writes are never offered for resuming.
            assert list_checkpoints(tmp_path) == [target]
        else:  # killed before the first save of the test completed
            assert list_checkpoints(tmp_path) == []
    assert target.exists()
    assert killed_mid_write >= 1, "no kill landed during a write; the test did not exercise anything"


# --------------------------------------------------------------------------- safe loading


def test_missing_file_error_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "epoch_9.pth"
    with pytest.raises(FileNotFoundError, match="epoch_9.pth"):
        load_file(missing)


@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.99])
def test_truncated_file_raises_checkpoint_error_naming_file(tmp_path: Path, keep: float) -> None:
    p = tmp_path / "epoch_3.pth"
    atomic_save(_ckpt(3), p)
    _truncate(p, keep)
    with pytest.raises(CheckpointError) as err:
        load_file(p)
    assert not isinstance(err.value, UnsafeCheckpointError)
    assert str(p) in str(err.value)
    assert "previous checkpoint" in str(err.value)


def test_corrupt_pickle_inside_archive_is_corrupt_not_unsafe(tmp_path: Path) -> None:
    """A damaged pickle can read like a forbidden global; the archive CRC tells them apart."""
    p = tmp_path / "epoch_3.pth"
    atomic_save({"od": torch.nn.Linear(2, 2).state_dict()}, p)  # pickles collections.OrderedDict
    data = bytearray(p.read_bytes())
    i = data.index(b"OrderedDict")
    data[i : i + 5] = b"Ordxx"
    p.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC") as err:
        load_file(p)
    assert not isinstance(err.value, UnsafeCheckpointError)


def _unsafe_torch_load(f):
    return torch.load(f, weights_only=False)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize(
    ("dump", "unsafe_load"),
    [
        (lambda obj, f: torch.save(obj, f), _unsafe_torch_load),
        (lambda obj, f: pickle.dump(obj, f, protocol=2), pickle.load),
        (lambda obj, f: pickle.dump(obj, f), pickle.load),
    ],
    ids=["torch.save", "pickle-protocol-2", "pickle-default"],
)
def test_malicious_pickle_is_refused_without_running_it(tmp_path: Path, dump, unsafe_load) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "epoch_1.pth"
    with open(evil, "wb") as f:
        dump({"state_dict": {}, "x": _Payload(marker)}, f)
    with pytest.raises(UnsafeCheckpointError) as err:
        load_file(evil)
    assert not marker.exists()
    msg = str(err.value)
    assert str(evil) in msg and "safety" in msg and "weights_only=False" in msg
    # The same directory is not resumed from silently either.
    with pytest.raises(UnsafeCheckpointError):
        find_resumable(tmp_path)
    assert not marker.exists()
    # Reference: the payload is real, an unsafe load does run it.
    with open(evil, "rb") as f:
        unsafe_load(f)
    assert marker.exists()


def test_load_file_reads_safetensors(tmp_path: Path) -> None:
    weights = {"a": torch.randn(3, 2), "b": torch.arange(5)}
    save_safetensors(weights, tmp_path / "w.safetensors")
    loaded = load_file(tmp_path / "w.safetensors")
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[k], weights[k]) for k in weights)


def test_truncated_safetensors_raises_checkpoint_error(tmp_path: Path) -> None:
    p = tmp_path / "w.safetensors"
    save_safetensors({"a": torch.randn(100, 10)}, p)
    _truncate(p, 0.5)
    with pytest.raises(CheckpointError, match="w.safetensors"):
        load_file(p)


# --------------------------------------------------------------------------- directory


def test_latest_pointer_is_a_plain_text_file(tmp_path: Path) -> None:
    assert read_latest(tmp_path) is None
    write_latest(tmp_path, "iter_200.pth")
    latest = tmp_path / "latest"
    assert latest.is_file() and not latest.is_symlink()
    assert latest.read_text().strip() == "iter_200.pth"
    assert read_latest(tmp_path) == "iter_200.pth"


def test_list_checkpoints_orders_by_step_and_skips_temp_and_best(tmp_path: Path) -> None:
    for n in (2, 10, 1):  # written out of order: numbers decide, not names or mtimes
        atomic_save(_ckpt(n), tmp_path / f"epoch_{n}.pth")
    atomic_save(_ckpt(11), tmp_path / "best_acc_epoch_11.pth")
    (tmp_path / ".epoch_12.pth.tmp.123.abcd").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("x")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["epoch_10.pth", "epoch_2.pth", "epoch_1.pth"]
    assert list_checkpoints(tmp_path / "does-not-exist") == []


def test_latest_pointer_comes_first(tmp_path: Path) -> None:
    for n in (100, 200, 300):
        atomic_save(_ckpt(n), tmp_path / f"iter_{n}.pth")
    write_latest(tmp_path, "iter_200.pth")  # e.g. the run was rolled back on purpose
    assert [p.name for p in list_checkpoints(tmp_path)] == ["iter_200.pth", "iter_300.pth", "iter_100.pth"]
    path, ckpt = find_resumable(tmp_path)
    assert path.name == "iter_200.pth"
    _assert_same(ckpt, _ckpt(200))
    # A pointer to a file that is gone is ignored.
    write_latest(tmp_path, "iter_999.pth")
    assert list_checkpoints(tmp_path)[0].name == "iter_300.pth"


def test_find_resumable_falls_back_past_a_truncated_checkpoint(tmp_path: Path) -> None:
    for n in (1, 2):
        atomic_save(_ckpt(n), tmp_path / f"epoch_{n}.pth")
    write_latest(tmp_path, "epoch_2.pth")
    _truncate(tmp_path / "epoch_2.pth")
    with pytest.warns(UserWarning, match="epoch_2.pth") as rec:
        path, ckpt = find_resumable(tmp_path)
    assert "cannot be loaded" in str(rec[0].message)
    assert path == tmp_path / "epoch_1.pth"
    _assert_same(ckpt, _ckpt(1))


def test_find_resumable_without_checkpoints_is_none(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert find_resumable(tmp_path) is None
        assert find_resumable(tmp_path / "missing") is None


def test_find_resumable_with_only_broken_checkpoints_is_an_error(tmp_path: Path) -> None:
    atomic_save(_ckpt(1), tmp_path / "epoch_1.pth")
    _truncate(tmp_path / "epoch_1.pth")
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="epoch_1.pth"):
        find_resumable(tmp_path)
