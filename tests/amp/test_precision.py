"""The precision plugin: names, dtypes, scaler presence, static scales and state."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainwright.amp import MixedPrecision, Precision, build_precision


@pytest.mark.parametrize(
    ("name", "dtype"), [("32", None), ("fp32", None), ("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)]
)
def test_build_precision_names(name: str, dtype: torch.dtype | None) -> None:
    p = build_precision(name, "cpu")
    assert p.dtype == dtype
    assert (p.scaler is not None) == (dtype == torch.float16)


def test_unknown_precision_suggests_a_name() -> None:
    with pytest.raises(ValueError, match="bf16-mixed"):
        build_precision("bf16_mixed")


def test_precision_object_passes_through() -> None:
    p = MixedPrecision("bfloat16")
    assert build_precision(p) is p


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_runs_linear_relu_cross_entropy_on_cpu(dtype: torch.dtype) -> None:
    """CPU autocast has half/bfloat16 kernels for the demo's ops; the loss is computed in float32."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    x, y = torch.randn(5, 8), torch.tensor([0, 1, 2, 3, 0])
    with MixedPrecision(dtype, "cpu").autocast():
        h = F.relu(lin(x))
        loss = F.cross_entropy(h, y)
    assert h.dtype == dtype
    assert loss.dtype == torch.float32  # cross_entropy is on autocast's float32 list
    ref = F.cross_entropy(F.relu(lin(x)), y)
    torch.testing.assert_close(loss, ref, atol=2e-2, rtol=2e-2)


def test_bf16_has_no_scaler_and_empty_state() -> None:
    p = build_precision("bf16-mixed", "cpu")
    assert p.scaler is None
    assert p.loss_scale is None
    assert p.state_dict() == {}


def test_fp16_scaler_is_enabled_on_cpu() -> None:
    """A bare GradScaler() would target CUDA and disable itself here."""
    p = build_precision("16-mixed", "cpu")
    assert p.scaler is not None and p.scaler.is_enabled()
    assert p.state_dict()["scaler"]["scale"] == 65536.0


def _overflow_step(p: Precision, model: nn.Linear, opt: torch.optim.Optimizer) -> None:
    with p.autocast():
        loss = model(torch.ones(2, 3)).sum()
    p.backward(loss)
    model.weight.grad[0, 0] = float("inf")
    p.optimizer_step(opt)
    opt.zero_grad()


def test_static_loss_scale_skips_overflow_but_keeps_scale() -> None:
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    p = MixedPrecision("float16", "cpu", loss_scale=512.0)
    before = model.weight.detach().clone()
    _overflow_step(p, model, opt)
    assert torch.equal(model.weight, before)  # skipped
    assert p.scaler.get_scale() == 512.0  # not backed off
    with p.autocast():
        loss = model(torch.ones(2, 3)).sum()
    p.backward(loss)
    p.optimizer_step(opt)
    assert not torch.equal(model.weight, before)
    assert p.scaler.get_scale() == 512.0


def test_step_without_any_gradient_is_a_noop() -> None:
    """Every micro-batch of a window skipped (non-finite loss): no GradScaler assertion."""
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    p = MixedPrecision("float16", "cpu")
    before = [t.detach().clone() for t in model.parameters()]
    p.optimizer_step(opt)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_bad_arguments_name_the_fix() -> None:
    with pytest.raises(ValueError, match="float16"):
        MixedPrecision("float8")
    with pytest.raises(ValueError, match="allowed"):
        MixedPrecision("float16", loss_scale=dict(init=2.0))
    with pytest.raises(ValueError, match="> 0"):
        MixedPrecision("float16", loss_scale=0.0)


def test_bf16_ignores_scaler_state_with_a_warning() -> None:
    fp16 = MixedPrecision("float16", "cpu")
    with pytest.warns(RuntimeWarning, match="GradScaler"):
        MixedPrecision("bfloat16", "cpu").load_state_dict(fp16.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MixedPrecision("bfloat16", "cpu").load_state_dict({})


def test_clone_has_same_settings_and_its_own_scaler() -> None:
    p = MixedPrecision("float16", "cpu", loss_scale=dict(init_scale=8.0, growth_interval=3))
    q = p.clone()
    assert q.scaler is not p.scaler
    assert q.state_dict() == p.state_dict()
