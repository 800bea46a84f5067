"""A synchronous save: in place when it returns (a kill -9 leaves it whole), fsynced in the background, older files
deleted only once it is durable, and a failed fsync raised at the next wait point."""

from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from trainwright.checkpoint import load_file, read_latest
from trainwright.checkpoint.durability import DurabilityError
from trainwright.checkpoint.manager import CheckpointManager
from trainwright.strategies import SingleDeviceStrategy
from trainwright.utils.progress import Progress

ROOT = Path(__file__).resolve().parents[2]

# A child that saves iter_1 (durable), then iter_2 with every fsync stalled, keep-1, and waits to be killed.
# os.fsync is replaced to stand for a slow disk: it is not what is tested; the save, retention and rename are.
_CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    import torch
    from trainwright.checkpoint.manager import CheckpointManager
    from trainwright.strategies import SingleDeviceStrategy
    from trainwright.utils.progress import Progress

    class W:
        def __init__(self):
            self.w = torch.arange(100_000, dtype=torch.float32)
        def state_dict(self):
            return {"w": self.w}
        def load_state_dict(self, state):
            self.w = state["w"]

    stall, real = threading.Event(), os.fsync
    def fsync(fd):
        if stall.is_set():
            time.sleep(3600)  # the disk never answers: the kill comes first
        real(fd)
    os.fsync = fsync

    w, progress, mode = W(), Progress(), sys.argv[2]
    m = CheckpointManager(SingleDeviceStrategy(device="cpu"), {"w": w}, sys.argv[1], progress=progress, keep=1)
    progress.iteration = 1
    m.save_periodic("iter_1.pth")
    m.strategy.wait_for_checkpoint()
    if mode == "kill":
        stall.set()
    else:  # "exit": a failing fsync nobody waits for
        def failing(fd):
            raise OSError(5, "Input/output error")
        os.fsync = failing
    w.w = w.w + 1
    progress.iteration = 2
    m.save_periodic("iter_2.pth")
    print("saved", flush=True)
    if mode == "kill":
        time.sleep(600)
    """
)


def _child(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path / "ckpt"), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.timeout(120)
def test_kill_9_right_after_a_save_leaves_it_loadable_and_the_previous_one_kept(tmp_path: Path) -> None:
    p = _child(tmp_path, "kill")
    try:
        assert p.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(p.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout=90)
        line = p.stdout.readline() if ready else ""  # the save returned; its fsync has not (it never will)
        if line.strip() != "saved":
            p.kill()
            pytest.fail(f"the child did not report its save: {p.communicate(timeout=60)[1][-3000:]}")
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=60)
    d = tmp_path / "ckpt"
    assert read_latest(d) == "iter_2.pth"
    torch.testing.assert_close(load_file(d / "iter_2.pth")["w"]["w"], torch.arange(100_000, dtype=torch.float32) + 1)
    # keep=1 dropped iter_1 from the record, but its file goes only once iter_2 is durable: it never was
    assert sorted(f.name for f in d.iterdir()) == ["iter_1.pth", "iter_2.pth", "latest"]
    assert load_file(d / "iter_1.pth")["w"]["w"][1] == 1


@pytest.mark.timeout(120)
def test_a_failed_fsync_nobody_waited_for_is_reported_at_exit(tmp_path: Path) -> None:
    p = _child(tmp_path, "exit")
    out, err = p.communicate(timeout=90)
    assert out.strip() == "saved" and p.returncode == 0, err[-3000:]
    assert "fsync of " in err and "iter_2.pth failed (Input/output error)" in err, err[-3000:]
    assert (tmp_path / "ckpt" / "iter_1.pth").is_file()  # not deleted: its successor never became durable


class _Piece:
    def __init__(self) -> None:
        self.w = torch.zeros(1000)

    def state_dict(self) -> dict[str, Any]:
        return {"w": self.w}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.w = state["w"]


def test_a_failed_fsync_is_raised_at_the_next_save_and_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress = Progress()
    m = CheckpointManager(SingleDeviceStrategy(device="cpu"), {"p": _Piece()}, tmp_path, progress=progress, keep=1)
    real = os.fsync

    def failing(fd: int) -> None:  # a disk that reports an I/O error (os.fsync is not what is tested)
        raise OSError(errno.EIO, "Input/output error")

    progress.iteration = 1
    m.save_periodic("iter_1.pth")
    m.strategy.wait_for_checkpoint()
    monkeypatch.setattr(os, "fsync", failing)
    progress.iteration = 2
    m.save_periodic("iter_2.pth")  # returns: the fsync runs in the background
    monkeypatch.setattr(os, "fsync", real)
    assert read_latest(tmp_path) == "iter_2.pth" and load_file(tmp_path / "iter_2.pth")["p"]["w"].shape == (1000,)
    progress.iteration = 3
    with pytest.raises(DurabilityError) as e:
        m.save_periodic("iter_3.pth")  # the next save waits for the previous one's fsync first
    assert e.value.errno == errno.EIO and e.value.filename == str(tmp_path / "iter_2.pth")
    assert f"fsync of {tmp_path / 'iter_2.pth'} failed (Input/output error)" in str(e.value)
    assert "Older checkpoints were kept" in str(e.value) and "resume=True" in str(e.value)
    # iter_3 was not written; iter_1 is still there: retention waited for iter_2 to be durable, which it never was
    assert sorted(f.name for f in tmp_path.glob("*.pth")) == ["iter_1.pth", "iter_2.pth"]

    progress.iteration = 3
    m.save_periodic("iter_3.pth")  # the error was raised once; the disk is fine again
    m.strategy.wait_for_checkpoint()
    # the files kept while iter_2 was not durable stay (the record let them go): the user's to delete
    assert sorted(f.name for f in tmp_path.glob("*.pth")) == ["iter_1.pth", "iter_2.pth", "iter_3.pth"]

    monkeypatch.setattr(os, "fsync", failing)
    progress.iteration = 4
    m.save_periodic("iter_4.pth")
    monkeypatch.setattr(os, "fsync", real)
    with pytest.raises(DurabilityError, match="iter_4.pth failed"):
        m.strategy.teardown()  # Trainer.close()
    assert sorted(f.name for f in tmp_path.glob("*.pth")) == ["iter_1.pth", "iter_2.pth", "iter_3.pth", "iter_4.pth"]
