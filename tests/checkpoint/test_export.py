"""Exports while training runs (issue 39 item 6): Hugging Face-style safetensors folders, tied weights stored once
and read back tied, bitwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.checkpoint import export_safetensors, load_exported, read_exported
from trainwright.hooks.hook import Hook


class TiedLM(tw.BaseModel):
    """An embedding whose weight is also the output layer's (tied), and a config as Hugging Face models have."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.emb.weight
        self.config = {"model_type": "tied-lm", "vocab_size": 11, "hidden_size": 8}

    def forward(self, x: torch.Tensor, y: torch.Tensor, mode: str = "tensor") -> Any:  # noqa: D102
        logits = self.head(torch.tanh(self.mid(self.emb(x))))
        return {"loss": nn.functional.cross_entropy(logits, y)} if mode == "loss" else logits


class Weights(Hook):
    def __init__(self) -> None:
        self.at: dict[int, dict[str, torch.Tensor]] = {}

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        self.at[trainer.progress.iteration] = {k: v.clone() for k, v in trainer.model.state_dict().items()}


def _fresh() -> TiedLM:
    torch.manual_seed(123)  # other weights than the trained ones
    return TiedLM()


def _assert_tied_and_equal(d: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert d.keys() == expected.keys()
    assert d["head.weight"] is d["emb.weight"]  # one tensor again
    for k, v in expected.items():
        assert d[k].dtype == v.dtype and torch.equal(d[k], v), k


def test_exports_during_training_round_trip_tied_and_bitwise(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, 11, (28,), generator=g), torch.randint(0, 11, (28,), generator=g))
    weights = Weights()
    # 400 bytes a file: emb (352 B) alone, mid (288 B) in a second file
    export = dict(type="SafetensorsExportHook", interval=3, out_dir=str(tmp_path / "exports"), max_shard_size=400)
    with tw.Trainer(
        model=TiedLM(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(data, batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.05)),
        train_cfg=dict(by_epoch=False, max_iters=7),
        default_hooks=dict(checkpoint=None),
        custom_hooks=[export, weights],
        randomness=dict(seed=0),
    ) as t:
        t.train()
    exports = tmp_path / "exports"
    assert sorted(p.name for p in exports.iterdir()) == ["iter_3", "iter_6", "iter_7"]  # every 3 and the end
    for n in (3, 6, 7):
        folder = exports / f"iter_{n}"
        assert sorted(p.name for p in folder.iterdir()) == [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
        ]
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        assert index["weight_map"] == {
            "emb.weight": "model-00001-of-00002.safetensors",
            "mid.weight": "model-00002-of-00002.safetensors",
            "mid.bias": "model-00002-of-00002.safetensors",
        }  # the tied output weight is stored once, as the embedding
        assert index["metadata"] == {"total_size": (88 + 64 + 8) * 4, "tied": {"head.weight": "emb.weight"}}
        assert json.loads((folder / "config.json").read_text())["model_type"] == "tied-lm"
        _assert_tied_and_equal(read_exported(folder), weights.at[n])
        model = _fresh()
        load_exported(model, folder)
        assert model.head.weight is model.emb.weight  # still tied in the model
        assert all(torch.equal(v, weights.at[n][k]) for k, v in model.state_dict().items())
    assert not list(exports.glob(".*"))  # no temporary folder left


def test_export_one_file_with_the_alias_in_its_metadata(tmp_path: Path) -> None:
    model = TiedLM()
    folder = export_safetensors(model, tmp_path / "out")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == ["emb.weight", "mid.bias", "mid.weight"]
        assert json.loads(f.metadata()["tied"]) == {"head.weight": "emb.weight"}
    _assert_tied_and_equal(read_exported(folder), model.state_dict())
    with pytest.raises(FileNotFoundError, match="not an exported weights folder"):
        read_exported(tmp_path)
