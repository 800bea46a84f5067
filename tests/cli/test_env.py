"""``trainwright env``: the default report answers from torch's files without importing torch, and says what
torch itself says; ``--full`` asks torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainwright.cli import main
from trainwright.cli.env import collect_env_info
from trainwright.dist import available_backends, detect_launcher

ROOT = Path(__file__).resolve().parents[2]

_NO_TORCH = """
import sys
from trainwright.cli import main
code = main(["env"])
print("torch imported:", "torch" in sys.modules)
sys.exit(code)
"""


def test_env_answers_without_importing_torch() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _NO_TORCH], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "torch imported: False" in out.stdout
    assert f"torch: {torch.__version__}" in out.stdout and "Distributed backends: " in out.stdout


def test_the_default_report_agrees_with_torch() -> None:
    fast = collect_env_info().splitlines()
    assert f"torch: {torch.__version__}" in fast
    backends = next(line for line in fast if line.startswith("Distributed backends: "))
    for name, available in available_backends().items():  # built in and working agree on a plain machine
        assert f"{name}={'yes' if available else 'no'}" in backends, backends
    cuda = next(line for line in fast if line.startswith("CUDA available: "))
    if torch.version.cuda is None and torch.version.hip is None:
        assert cuda == "CUDA available: False (a CPU-only build of torch)"
    assert f"Launcher detected: {detect_launcher()}" in fast


def test_env_full_asks_torch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--full"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"CUDA available: {torch.cuda.is_available()}" in out
    assert f"CPU threads: {torch.get_num_threads()}" in out
    assert (
        "Distributed backends: " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in available_backends().items())
        in out
    )
