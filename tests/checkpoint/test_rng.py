"""RNG state: a round trip through a safe-loadable checkpoint reproduces every generator."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trainwright.checkpoint import atomic_save, get_rng_state, load_file, set_rng_state


def _draw() -> dict:
    out = {
        "python": [random.random() for _ in range(5)] + [random.gauss(0, 1)],
        "numpy": np.random.rand(5).tolist() + [float(np.random.normal())],
        "torch": torch.rand(5),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.rand(5, device="cuda").cpu()
    return out


def _assert_draws_equal(a: dict, b: dict) -> None:
    assert a["python"] == b["python"]
    assert a["numpy"] == b["numpy"]
    assert torch.equal(a["torch"], b["torch"])
    if "cuda" in a:
        assert torch.equal(a["cuda"], b["cuda"])


def test_round_trip_through_a_weights_only_checkpoint(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leave a cached gaussian in both generators' state
    np.random.normal()
    state = get_rng_state()
    expected = _draw()

    atomic_save({"rng": state}, tmp_path / "ckpt.pth")
    loaded = torch.load(tmp_path / "ckpt.pth", weights_only=True)["rng"]  # the safe loader accepts it

    _draw()  # move every generator on, as the rest of a run would
    set_rng_state(loaded)
    _assert_draws_equal(_draw(), expected)
    set_rng_state(load_file(tmp_path / "ckpt.pth")["rng"])
    _assert_draws_equal(_draw(), expected)


def test_state_holds_only_safe_types() -> None:
    def check(obj, where: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                assert isinstance(k, str), where
                check(v, f"{where}.{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                check(v, f"{where}[{i}]")
        else:
            assert obj is None or type(obj) in (torch.Tensor, int, float, str, bool), f"{where}: {type(obj)}"

    check(get_rng_state(), "state")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_cuda_states_without_cuda_are_ignored_with_a_warning() -> None:
    state = get_rng_state()
    assert "torch_cuda" not in state
    state["torch_cuda"] = [torch.get_rng_state()]  # as if saved on a 1-GPU machine
    expected_cpu = torch.rand(3, generator=torch.Generator().set_state(state["torch"]))
    with pytest.warns(UserWarning, match="CUDA"):
        set_rng_state(state)
    assert torch.equal(torch.rand(3), expected_cpu)
