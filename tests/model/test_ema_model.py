"""ExponentialMovingAverage: matches a hand-written EMA, never syncs, resumes exactly, swaps losslessly."""

from __future__ import annotations

import copy
import io
from collections import Counter

import pytest
import torch
from torch import nn

from trainwright.model.ema import ExponentialMovingAverage


def _net(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).to(dtype)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 4, generator=g).to(next(model.parameters()).dtype)
    model.train()
    opt.zero_grad()
    model(x).float().pow(2).mean().backward()
    opt.step()


def _reference_run(
    model: nn.Module, steps: int, momentum: float, interval: int, update_buffers: bool, start_seed: int = 0
):
    """Train ``model`` for ``steps`` steps and keep a textbook EMA of its state in float64."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    param_keys = {k for k, _ in model.named_parameters()}
    ref: dict[str, torch.Tensor] = {}
    for step in range(steps):
        _train_step(model, opt, start_seed + step)
        src = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for k, v in src.items():
            averaged = v.is_floating_point() and (k in param_keys or update_buffers)
            if step == 0 or not averaged:
                ref[k] = v.double() if v.is_floating_point() else v.clone()
            elif step % interval == 0:
                ref[k] = (1 - momentum) * ref[k] + momentum * v.double()
    return ref


@pytest.mark.parametrize("update_buffers", [False, True])
@pytest.mark.parametrize("interval", [1, 3])
def test_matches_hand_written_ema(update_buffers: bool, interval: int) -> None:
    momentum, steps = 0.1, 8
    ref = _reference_run(_net(), steps, momentum, interval, update_buffers)

    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ema = ExponentialMovingAverage(model, momentum=momentum, update_buffers=update_buffers, interval=interval)
    for step in range(steps):
        _train_step(model, opt, step)
        ema.update_parameters(model)
    assert ema.steps == steps
    averaged = ema.state_dict()["averaged"]
    assert list(averaged) == list(model.state_dict())
    for k, v in ref.items():
        if v.is_floating_point():
            torch.testing.assert_close(averaged[k].double(), v, atol=1e-6, rtol=0)
        else:
            assert torch.equal(averaged[k], v), k
    # the EMA really differs from the last weights (the test can fail)
    assert not torch.allclose(averaged["0.weight"], model.state_dict()["0.weight"])
    # and it is a loadable state dict for the model
    model.load_state_dict(averaged)


def test_low_precision_model_is_averaged_in_float32() -> None:
    momentum, steps = 0.05, 6
    ref = _reference_run(_net(torch.bfloat16), steps, momentum, 1, False)
    model = _net(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ema = ExponentialMovingAverage(model, momentum=momentum)
    for step in range(steps):
        _train_step(model, opt, step)
        ema.update_parameters(model)
    averaged = ema.state_dict()["averaged"]
    assert averaged["0.weight"].dtype == torch.float32
    for k, v in ref.items():
        if v.is_floating_point():
            torch.testing.assert_close(averaged[k].double(), v, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_update_does_no_host_sync(sync_calls: Counter[str], dtype: torch.dtype) -> None:
    model = _net(dtype)
    ema = ExponentialMovingAverage(model, momentum=0.1, update_buffers=True, interval=2)
    before = dict(sync_calls)
    for _ in range(5):
        ema.update_parameters(model)
    assert sync_calls == before, {k: sync_calls[k] - before.get(k, 0) for k in sync_calls}
    # the instrumentation itself works
    bool(torch.ones(()))
    float(torch.ones(()))
    assert (
        sync_calls["__bool__"] == before.get("__bool__", 0) + 1
        and sync_calls["__float__"] == before.get("__float__", 0) + 1
    )


@pytest.mark.cuda
def test_update_does_no_cuda_sync() -> None:
    model = _net().cuda()
    ema = ExponentialMovingAverage(model, momentum=0.1, update_buffers=True, interval=2)
    ema.update_parameters(model)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            ema.update_parameters(model)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_state_round_trip_continues_identically() -> None:
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ema = ExponentialMovingAverage(model, momentum=0.1, interval=2)
    for step in range(5):
        _train_step(model, opt, step)
        ema.update_parameters(model)
    buf = io.BytesIO()
    torch.save(ema.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)

    resumed_model = copy.deepcopy(model)
    resumed = ExponentialMovingAverage(_net(), momentum=0.1, interval=2)  # built from other weights
    resumed.load_state_dict(saved)
    assert resumed.steps == 5
    resumed_opt = torch.optim.SGD(resumed_model.parameters(), lr=0.5)
    resumed_opt.load_state_dict(opt.state_dict())
    for step in range(5, 9):
        _train_step(model, opt, step)
        ema.update_parameters(model)
        _train_step(resumed_model, resumed_opt, step)
        resumed.update_parameters(resumed_model)
    for k, v in ema.state_dict()["averaged"].items():
        assert torch.equal(resumed.state_dict()["averaged"][k], v), k
    assert resumed.steps == ema.steps == 9


def test_swap_in_and_out_restores_training_weights_bit_for_bit() -> None:
    model = _net(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ema = ExponentialMovingAverage(model, momentum=0.3)
    for step in range(4):
        _train_step(model, opt, step)
        ema.update_parameters(model)
    training = {k: v.clone() for k, v in model.state_dict().items()}
    params_before = [id(p) for p in model.parameters()]

    with ema.applied_to(model):
        inside = model.state_dict()
        for k, v in ema.state_dict()["averaged"].items():
            assert torch.equal(inside[k], v.to(inside[k].dtype)), k
        assert not torch.equal(inside["0.weight"], training["0.weight"])
        assert ema.swapped_in
    assert not ema.swapped_in
    for k, v in model.state_dict().items():
        assert torch.equal(v, training[k]) and v.dtype == training[k].dtype, k
    # the optimizer still holds the same Parameter objects
    assert [id(p) for p in model.parameters()] == params_before
    assert [id(p) for p in opt.param_groups[0]["params"]] == params_before


def test_swap_misuse_is_an_error() -> None:
    model = _net()
    ema = ExponentialMovingAverage(model)
    with pytest.raises(RuntimeError, match="swap_in"):
        ema.swap_out(model)
    ema.swap_in(model)
    with pytest.raises(RuntimeError, match="swap_out"):
        ema.swap_in(model)


def test_copy_to_and_sync_from() -> None:
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ema = ExponentialMovingAverage(model, momentum=0.2)
    for step in range(3):
        _train_step(model, opt, step)
        ema.update_parameters(model)
    target = _net()
    ema.copy_to(target)
    for k, v in ema.state_dict()["averaged"].items():
        assert torch.equal(target.state_dict()[k], v), k
    ema.sync_from(model)
    for k, v in model.state_dict().items():
        assert torch.equal(ema.state_dict()["averaged"][k], v), k
    assert ema.steps == 3


def test_load_state_dict_names_mismatches() -> None:
    ema = ExponentialMovingAverage(_net())
    state = ema.state_dict()
    other = ExponentialMovingAverage(nn.Sequential(nn.Linear(4, 8)))
    with pytest.raises(KeyError, match=r"missing keys \[\]"):
        other.load_state_dict(state)
    wider = ExponentialMovingAverage(nn.Sequential(nn.Linear(4, 9), nn.BatchNorm1d(9), nn.ReLU(), nn.Linear(9, 2)))
    with pytest.raises(ValueError, match=r"0.weight: saved \(8, 4\), model \(9, 4\)"):
        wider.load_state_dict(state)


def test_update_with_another_model_is_an_error() -> None:
    ema = ExponentialMovingAverage(_net())
    with pytest.raises(KeyError, match="same \\(unwrapped\\) module"):
        ema.update_parameters(nn.Linear(4, 2))


@pytest.mark.parametrize("kwargs", [dict(momentum=0.0), dict(momentum=1.5), dict(interval=0)])
def test_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ExponentialMovingAverage(_net(), **kwargs)
