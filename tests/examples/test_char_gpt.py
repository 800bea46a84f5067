"""The character GPT example: trains in bf16 on Python's own help text, and its loss curve plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwright.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "examples" / "char_gpt.py")


@pytest.mark.slow
def test_char_gpt_trains_and_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    monkeypatch.chdir(tmp_path)
    short = [
        "train_cfg.max_iters=12",
        "train_cfg.val_interval=6",
        "default_hooks.logger.interval=2",
        "default_hooks.checkpoint.interval=6",
        "param_scheduler.0.end=4",
        "param_scheduler.1.begin=4",
        "param_scheduler.1.end=12",
        "custom_hooks.0.length=20",
    ]
    assert main(["train", CONFIG, "--work-dir", "wd", "--cfg-options", *short]) == 0
    assert [
        str(w.message) for w in recwarn
    ] == []  # the shipped example with its stock hooks and settings: not one warning
    (run,) = [p for p in (tmp_path / "wd").iterdir() if p.name != "checkpoints"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["mode"] == "train"]
    val = [r for r in records if r["mode"] == "val"]
    assert len(train) == 6 and len(val) == 2
    assert train[-1]["loss"] < train[0]["loss"]  # it learns, even in 12 steps (from ln(96) = 4.56)
    assert val[-1]["val/loss"] < 4.0 and val[-1]["val/bpc"] > 0
    log = (run / "train.log").read_text()
    assert (
        "'precision': 'bf16-mixed'" in (run / "config.py").read_text()
        or "precision = 'bf16-mixed'" in (run / "config.py").read_text()
    )
    assert "Sample after training:" in log
    assert " - WARNING - " not in log, [line for line in log.splitlines() if " - WARNING - " in line]
    assert main(["plot", "wd", "--keys", "loss", "val/loss", "--out", "gpt.png"]) == 0
    assert (tmp_path / "gpt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
