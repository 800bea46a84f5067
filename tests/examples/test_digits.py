"""The digits demo config reaches the accuracy bar and leaves a complete work dir."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trainwright as tw
from trainwright.checkpoint.io import load_file
from trainwright.config import Config
from trainwright.registry import DATASETS

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "digits.py"


def test_digits_reaches_accuracy_and_writes_work_dir(tmp_path, recwarn):
    cfg = Config.fromfile(CONFIG)
    trainer = tw.Trainer.from_config(cfg, work_dir=str(tmp_path), experiment_name="run")
    try:
        model = trainer.train()
        metrics = trainer.val()
        # the shipped example with the stock hooks and settings: not one warning (Python's or the log's)
        assert [str(w.message) for w in recwarn] == []
        assert metrics["val/acc"] >= 0.95

        # the metric agrees with a hand computation on the validation split
        x, y = DATASETS.build(dict(type="DigitsDataset", split="val")).tensors
        model.eval()
        with torch.no_grad():
            hand = (model(x, mode="predict").argmax(1) == y).float().mean().item()
        assert metrics["val/acc"] == pytest.approx(hand)

        run = tmp_path / "run"
        log = (run / "train.log").read_text()
        assert "Epoch(train) [10]" in log and "val/acc" in log and "Random seed: 0" in log
        assert " - WARNING - " not in log, [line for line in log.splitlines() if " - WARNING - " in line]
        assert Config.fromfile(run / "config.py").train_cfg.max_epochs == 10  # the resolved config, in the run folder

        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in records if r["mode"] == "train"]
        val = [r for r in records if r["mode"] == "val"]
        assert len(train) >= 10
        for r in train:
            for key in ("loss", "lr", "grad_norm", "time", "data_time"):
                assert isinstance(r[key], float) and math.isfinite(r[key]), (key, r)
        assert train[-1]["loss"] < train[0]["loss"]
        assert [r["epoch"] for r in val[:10]] == list(range(1, 11))
        assert val[9]["val/acc"] == pytest.approx(metrics["val/acc"])

        ckpts = {p.name for p in (tmp_path / "checkpoints").glob("*.pth")}
        assert {
            "epoch_8.pth",
            "epoch_9.pth",
            "epoch_10.pth",
        } <= ckpts and "epoch_7.pth" not in ckpts  # max_keep_ckpts=3
        best = [n for n in ckpts if n.startswith("best_val_acc_epoch_")]
        assert len(best) == 1
        final = load_file(tmp_path / "checkpoints" / "epoch_10.pth")
        for k, v in trainer.unwrapped_model.state_dict().items():
            assert torch.equal(final["model"][k], v)
    finally:
        trainer.close()


@pytest.mark.slow
def test_digits_command_line(tmp_path):
    """The README's run command: ``trainwright train examples/digits.py``, then ``trainwright test``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "trainwright"]
    train = subprocess.run(
        [*cmd, "train", str(CONFIG), "--work-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    assert "WARNING" not in train.stdout + train.stderr and "Warning:" not in train.stderr, (
        train.stdout[-3000:] + train.stderr[-3000:]
    )
    assert (tmp_path / "checkpoints" / "latest").exists()
    out = subprocess.run(
        [
            *cmd,
            "test",
            str(CONFIG),
            "--work-dir",
            str(tmp_path),
            "--checkpoint",
            str(tmp_path / "checkpoints" / "epoch_10.pth"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    assert "WARNING" not in out.stdout + out.stderr and "Warning:" not in out.stderr, (
        out.stdout[-3000:] + out.stderr[-3000:]
    )
    assert json.loads(out.stdout.strip().splitlines()[-1])["test/acc"] >= 0.95
