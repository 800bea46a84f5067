"""Loading weights into a model (errors that name keys and shapes) and safetensors export."""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file as raw_save_file
from torch import nn

from trainwright.checkpoint import (
    IncompatibleKeys,
    atomic_save,
    load_file,
    load_model_weights,
    load_safetensors,
    revise_state_dict_keys,
    save_safetensors,
)


class Net(nn.Module):
    def __init__(self, hidden: int = 4, out: int = 3) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


class TiedLM(nn.Module):
    """An embedding tied to the output projection, as in most language models."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(idx))


def _params_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _torch_size_mismatch_lines(model: nn.Module, state: dict) -> list[str]:
    """torch's own "size mismatch for ..." lines for the same load (the reference wording)."""
    with pytest.raises(RuntimeError) as err:
        copy.deepcopy(model).load_state_dict(state, strict=False)
    return [ln.strip() for ln in str(err.value).splitlines() if ln.strip().startswith("size mismatch")]


def test_loads_weights_exactly() -> None:
    torch.manual_seed(0)
    src, dst = Net(), Net()
    assert not _params_equal(src, dst)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = load_model_weights(dst, src.state_dict(), strict=True)
    assert result == IncompatibleKeys([], [])
    assert _params_equal(src, dst)


@pytest.mark.parametrize("strict", [False, True])
def test_shape_mismatch_names_every_key_and_both_shapes(strict: bool) -> None:
    src, dst = Net(hidden=4, out=3), Net(hidden=4, out=7)
    state = src.state_dict()
    state["fc1.weight"] = torch.zeros(9, 5)  # a second mismatch, in another layer
    before = copy.deepcopy(dst)
    with pytest.raises(RuntimeError) as err:
        load_model_weights(dst, state, strict=strict)
    msg = str(err.value)
    expected = _torch_size_mismatch_lines(dst, state)
    assert len(expected) == 3  # fc1.weight, fc2.weight, fc2.bias
    for line in expected:
        assert line in msg
    assert "torch.Size([9, 5])" in msg and "torch.Size([4, 5])" in msg
    assert _params_equal(dst, before), "a failed load must not change the model"


def test_missing_and_unexpected_keys_error_when_strict() -> None:
    src, dst = Net(), Net()
    state = src.state_dict()
    del state["fc2.bias"]
    state["extra.weight"] = torch.ones(2)
    before = copy.deepcopy(dst)
    with pytest.raises(RuntimeError) as err:
        load_model_weights(dst, state, strict=True)
    msg = str(err.value)
    assert '"fc2.bias"' in msg and '"extra.weight"' in msg
    assert "Missing key" in msg and "Unexpected key" in msg and "strict=False" in msg
    assert _params_equal(dst, before), "a strict failure must not load anything"


def test_missing_and_unexpected_keys_warn_when_not_strict() -> None:
    src, dst = Net(), Net()
    state = src.state_dict()
    del state["fc2.bias"]
    state["extra.weight"] = torch.ones(2)
    with pytest.warns(UserWarning) as rec:
        result = load_model_weights(dst, state, strict=False)
    assert len(rec) == 1
    assert "fc2.bias" in str(rec[0].message) and "extra.weight" in str(rec[0].message)
    # Reference: torch reports the same keys for the same load.
    ref = copy.deepcopy(Net()).load_state_dict(state, strict=False)
    assert result.missing_keys == ref.missing_keys
    assert result.unexpected_keys == ref.unexpected_keys
    assert torch.equal(dst.fc1.weight, src.fc1.weight)


def test_module_prefix_is_stripped_by_default() -> None:
    src, dst = Net(), Net()
    wrapped = {f"module.{k}": v for k, v in src.state_dict().items()}
    load_model_weights(dst, wrapped, strict=True)
    assert _params_equal(src, dst)


def test_custom_revise_keys_apply_in_order() -> None:
    state = {"module.backbone.fc1.weight": 1, "module.head.w": 2}
    revised = revise_state_dict_keys(state, [(r"^module\.", ""), (r"^backbone\.", "")])
    assert revised == {"fc1.weight": 1, "head.w": 2}
    with pytest.raises(ValueError, match="both"):
        revise_state_dict_keys({"module.a": 1, "a": 2})


@pytest.mark.parametrize("wrap", ["model", "state_dict"])
def test_accepts_checkpoint_dicts_wrapping_the_weights(tmp_path: Path, wrap: str) -> None:
    src, dst = Net(), Net()
    ckpt = {wrap: src.state_dict(), "optimizer": {"state": {}, "param_groups": []}, "meta": {"epoch": 3}}
    atomic_save(ckpt, tmp_path / "epoch_3.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_model_weights(dst, load_file(tmp_path / "epoch_3.pth"), strict=True)
    assert _params_equal(src, dst)


def test_safetensors_round_trip(tmp_path: Path) -> None:
    src, dst = Net(), Net()
    path = tmp_path / "net.safetensors"
    save_safetensors(src, path, metadata={"epoch": "3"})
    loaded = load_safetensors(path)
    assert all(v.device.type == "cpu" for v in loaded.values())
    load_model_weights(dst, loaded, strict=True)
    assert _params_equal(src, dst)
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"epoch": "3"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.safetensors"]


def test_safetensors_handles_tied_and_non_contiguous_tensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    src = TiedLM()
    # Reference: safetensors on its own refuses tied weights.
    with pytest.raises(RuntimeError, match="share memory"):
        raw_save_file(src.state_dict(), str(tmp_path / "raw.safetensors"))
    path = tmp_path / "lm.safetensors"
    save_safetensors(src, path)
    dst = TiedLM()
    load_model_weights(dst, load_safetensors(path), strict=True)
    assert dst.head.weight is dst.embed.weight  # still tied after loading
    idx = torch.tensor([[1, 2, 3]])
    assert torch.equal(dst(idx), src(idx))

    base = torch.arange(12.0).reshape(3, 4)
    views = {"t": base.t(), "row": base[1], "whole": base}
    save_safetensors(views, tmp_path / "views.safetensors")
    back = load_safetensors(tmp_path / "views.safetensors")
    assert all(torch.equal(back[k], v) for k, v in views.items())


def test_safetensors_rejects_non_tensors_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=re.escape("'step'")):
        save_safetensors({"w": torch.ones(2), "step": 3}, tmp_path / "x.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_load_safetensors_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="gone.safetensors"):
        load_safetensors(tmp_path / "gone.safetensors")
