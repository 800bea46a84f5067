"""The streaming character GPT example: trains from local text shards read as a Hugging Face stream with 2 loader
workers; its checkpoints hold the stream's position (tests/data/test_stream_resume.py resumes such a stream)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainwright.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "examples" / "char_gpt_stream.py")


@pytest.mark.slow
def test_char_gpt_stream_trains_from_text_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    small = [
        "model.dim=32",
        "model.heads=2",
        "train_dataloader.batch_size=8",
        f"train_dataloader.dataset.shards_dir={tmp_path / 'shards'}",
        "val_dataloader.dataset.stride=2048",
        "train_cfg.val_interval=4",
        "default_hooks.logger.interval=1",
        "default_hooks.checkpoint.interval=2",
        "default_hooks.checkpoint.max_keep_ckpts=2",
        "param_scheduler.0.end=1",
        "param_scheduler.1.begin=1",
        "param_scheduler.1.end=4",
        "custom_hooks.0.length=4",
        "precision=fp32",
    ]
    assert main(["train", CONFIG, "--work-dir", "wd", "--cfg-options", "train_cfg.max_iters=4", *small]) == 0
    assert len(list((tmp_path / "shards").glob("shard*.jsonl"))) == 8
    (run,) = (tmp_path / "wd").glob("*/metrics.jsonl")
    train = [r for r in map(json.loads, run.open()) if r["mode"] == "train"]
    assert [r["iter"] for r in train] == [1, 2, 3, 4] and train[-1]["loss"] < train[0]["loss"]
    state = torch.load(tmp_path / "wd" / "checkpoints" / "iter_2.pth", weights_only=True)["data_state"]
    assert state["stream"] is not None  # the stream's position (both workers'): a resume goes on from it, no replay
