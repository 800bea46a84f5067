"""ProgressBarHook: a live bar on a terminal (checked under a pseudo-terminal), plain lines elsewhere."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import trainwright as tw
from trainwright.hooks import ProgressBarHook

CHILD = Path(__file__).with_name("bar_train.py")
SRC = Path(tw.__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR", "COLUMNS", "LINES")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    env["TERM"] = "xterm-256color"
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run_dir(output: str) -> Path:
    line = next(x for x in output.splitlines() if x.startswith("RUN_DIR "))
    return Path(line.split(" ", 1)[1].strip())


def _run_under_pty(args: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run a child with a pseudo-terminal (120 columns) as its stdin/stdout/stderr; return (exit code, everything it
    wrote)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, *args], stdin=slave, stdout=slave, stderr=slave, env=_env(), close_fds=True
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal (EIO)
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow  # a child process training for a few seconds
def test_terminal_shows_live_bar_with_rate_eta_and_loss_and_lines_above_it(tmp_path):
    code, out = _run_under_pty([str(CHILD), str(tmp_path)])
    assert code == 0, out[-3000:]
    assert "\x1b[2K" in out  # the bar is redrawn in place (erase line), i.e. it is live
    assert "train epoch 1/2" in out and "train epoch 2/2" in out
    assert "it/s" in out and "eta" in out
    assert "loss 1." in out or "loss 0." in out  # the latest logged loss is on the bar
    assert "lr 1.00e-01" in out
    assert "val " in out  # a bar for each validation pass
    # log lines, print() and the bar's final state all reach the terminal
    assert "Epoch(train) [1][20/60]" in out and "Epoch(val) [2]" in out
    assert "print() from user code" in out
    assert "120/120" in out
    # train.log never receives the bar
    log = (_run_dir(out) / "train.log").read_text()
    assert "Epoch(train) [2][60/60]" in log
    assert "\r" not in log and "\x1b" not in log and "it/s" not in log


@pytest.mark.slow  # a child process training for a few seconds
def test_off_a_terminal_plain_lines_no_carriage_return(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path)], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "\r" not in out and "\x1b" not in out and "it/s" not in out
    lines = [x for x in proc.stdout.splitlines() if "Epoch(train)" in x]
    assert [x.split("Epoch(train) ")[1].split("  ")[0] for x in lines] == [
        "[1][20/60]",
        "[1][40/60]",
        "[1][60/60]",
        "[2][20/60]",
        "[2][40/60]",
        "[2][60/60]",
    ]
    log = (_run_dir(proc.stdout) / "train.log").read_text()
    assert "\r" not in log and "Epoch(train) [2][60/60]" in log


@pytest.mark.slow  # a child process training for a few seconds
def test_enable_false_under_a_terminal_draws_nothing(tmp_path):
    code, out = _run_under_pty([str(CHILD), str(tmp_path), "false"])
    assert code == 0, out[-3000:]
    assert "it/s" not in out and "\x1b[2K" not in out
    assert "Epoch(train) [2][60/60]" in out


def test_decision_main_process_and_terminal_only(trainer_factory):
    t = trainer_factory()
    assert not ProgressBarHook().shows_bar(t)  # pytest's captured stdout is not a terminal
    assert ProgressBarHook(enable=True).shows_bar(t)
    assert not ProgressBarHook(enable=False).shows_bar(t)
    other_rank = SimpleNamespace(strategy=SimpleNamespace(is_main_process=False), logger=t.logger)
    assert not ProgressBarHook(enable=True).shows_bar(other_rank)  # type: ignore[arg-type]


def test_stock_hook_configured_and_switched_off_by_name(trainer_factory):
    t = trainer_factory()
    assert isinstance(t.hooks.get(ProgressBarHook), ProgressBarHook)
    t2 = trainer_factory(default_hooks=dict(checkpoint=None, progress_bar=dict(refresh_per_second=4)))
    assert t2.hooks.get(ProgressBarHook).refresh_per_second == 4
    t3 = trainer_factory(default_hooks=dict(checkpoint=None, progress_bar=None))
    assert t3.hooks.get(ProgressBarHook) is None
    t3.train()  # trains without it


@pytest.mark.parametrize("kwargs", [dict(enable="yes"), dict(refresh_per_second=0)])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="ProgressBarHook"):
        ProgressBarHook(**kwargs)


def test_in_process_off_a_terminal_no_bar_and_no_carriage_return(trainer_factory, capsys):
    t = trainer_factory(log_level="INFO", train_cfg=dict(max_epochs=2))
    t.train()
    t.flush_logs()
    out = capsys.readouterr().out
    assert "Epoch(train) [2][10/10]" in out
    assert "\r" not in out and "\x1b" not in out and "it/s" not in out
    assert "\r" not in (t.run_dir / "train.log").read_text()
