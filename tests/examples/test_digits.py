"""The digits demo reaches the accuracy bar and leaves a complete work dir."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainwright.checkpoint.io import load_file

ROOT = Path(__file__).resolve().parents[2]


def _load_demo():
    spec = importlib.util.spec_from_file_location("digits_demo", ROOT / "examples" / "digits.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_digits_reaches_accuracy_and_writes_work_dir(tmp_path):
    demo = _load_demo()
    trainer = demo.build_trainer(work_dir=str(tmp_path), experiment_name="run")
    try:
        model = trainer.train()
        metrics = trainer.val()
        assert metrics["val/acc"] >= 0.95

        # the metric agrees with a hand computation on the validation split
        _, val_set = demo.digits_datasets()
        x, y = val_set.tensors
        model.eval()
        with torch.no_grad():
            hand = (model(x, mode="predict").argmax(1) == y).float().mean().item()
        assert metrics["val/acc"] == pytest.approx(hand)

        run = tmp_path / "run"
        log = (run / "train.log").read_text()
        assert "Epoch(train) [10]" in log and "val/acc" in log and "Random seed: 0" in log

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
        assert {"epoch_8.pth", "epoch_9.pth", "epoch_10.pth"} <= ckpts and "epoch_7.pth" not in ckpts  # max_keep_ckpts=3
        best = [n for n in ckpts if n.startswith("best_val_acc_epoch_")]
        assert len(best) == 1
        final = load_file(tmp_path / "checkpoints" / "epoch_10.pth")
        for k, v in trainer.unwrapped_model.state_dict().items():
            assert torch.equal(final["model"][k], v)
    finally:
        trainer.close()


@pytest.mark.slow
def test_digits_command_line(tmp_path):
    """The README's run command."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "digits.py"), "--work-dir", str(tmp_path), "--epochs", "10"], capture_output=True, text=True, timeout=120, check=True)
    acc = float(out.stdout.strip().splitlines()[-1].split()[-1])
    assert acc >= 0.95
    assert (tmp_path / "checkpoints" / "latest").exists()
