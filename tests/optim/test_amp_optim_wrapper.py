"""AmpOptimWrapper: float16 loss scaling on CPU (skip on inf, backoff, growth, unscale
before clipping) against torch's own GradScaler, bfloat16 without a scaler, state, builder."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainwright.amp import MixedPrecision
from trainwright.optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict, build_optim_wrapper


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 6, generator=g) * 3, torch.randint(0, 3, (8,), generator=g)


def _loss(model: nn.Module, ow: OptimWrapper) -> torch.Tensor:
    x, y = _batch()
    with ow.optim_context(model):
        return F.cross_entropy(model(x), y)


def _opt_state(opt: torch.optim.Optimizer) -> dict:
    return copy.deepcopy(opt.state_dict()["state"])


def test_inf_gradients_skip_the_step_then_scale_backs_off_and_regrows() -> None:
    model = _model()
    ow = AmpOptimWrapper(
        torch.optim.Adam(model.parameters(), lr=1e-2),
        dtype="float16",
        loss_scale=dict(init_scale=2.0**10, growth_interval=3),
    )
    scaler = ow.precision.scaler
    assert scaler is not None and scaler.is_enabled()
    ow.update_params(_loss(model, ow))  # one clean step: Adam has state now
    assert scaler.get_scale() == 2.0**10 and scaler._get_growth_tracker() == 1
    weights = [p.detach().clone() for p in model.parameters()]
    state = _opt_state(ow.optimizer)

    ow.backward(_loss(model, ow))
    model[0].weight.grad[0, 0] = float("inf")  # injected overflow
    ow.step()
    ow.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters())), "weights changed on an inf step"
    after = _opt_state(ow.optimizer)
    for k in state:
        for name in state[k]:
            assert torch.equal(torch.as_tensor(state[k][name]), torch.as_tensor(after[k][name])), (
                f"optimizer state {name} changed"
            )
    assert scaler.get_scale() == 2.0**10 * 0.5  # backoff_factor
    assert scaler._get_growth_tracker() == 0

    for i in range(3):  # growth_interval clean steps
        assert scaler.get_scale() == 2.0**9, f"grew early at clean step {i}"
        ow.update_params(_loss(model, ow))
    assert scaler.get_scale() == 2.0**10  # growth_factor 2
    assert float(ow.loss_scale) == 2.0**10
    assert not all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


@pytest.mark.parametrize("clip_grad", [dict(max_norm=0.05), dict(type="value", clip_value=0.01)])
def test_clipping_after_unscale_matches_torch_reference(clip_grad: dict) -> None:
    """Same forward/backward/clip/step as the torch AMP recipe, and the clipped norm is the true one."""
    init = 2.0**12
    model = _model()
    ref = copy.deepcopy(model)
    ow = AmpOptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.5),
        dtype="float16",
        loss_scale=dict(init_scale=init),
        clip_grad=clip_grad,
    )
    ow.update_params(_loss(model, ow))

    # Reference: torch's recipe, written out by hand.
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=init)
    x, y = _batch()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(ref(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    if clip_grad.get("type") == "value":
        torch.nn.utils.clip_grad_value_(ref.parameters(), clip_grad["clip_value"])
        ref_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ref.parameters()]))
    else:
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip_grad["max_norm"])
    scaler.step(opt)
    scaler.update()
    torch.testing.assert_close(ow.grad_norm, ref_norm)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    # The norm clipping saw is the unscaled one: equal to the gradient norm of the same
    # autocast loss back-propagated without any scaling (not `init` times larger).
    if clip_grad.get("type") != "value":
        plain = _model()
        with torch.autocast("cpu", dtype=torch.float16):
            F.cross_entropy(plain(x), y).backward()
        true_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in plain.parameters()]))
        assert true_norm > clip_grad["max_norm"]  # clipping was active
        torch.testing.assert_close(ow.grad_norm, true_norm, rtol=1e-5, atol=0)


def test_mmengines_use_fsdp_is_accepted_from_a_config() -> None:
    from trainwright.optim import build_optim_wrapper

    ow = build_optim_wrapper(_model(), dict(type="AmpOptimWrapper", use_fsdp=True, optimizer=dict(type="SGD", lr=0.1)))
    assert (
        isinstance(ow, AmpOptimWrapper) and ow.precision.scaler is not None
    )  # float16 by default; the strategy picks the sharded one


def test_bf16_wrapper_has_no_scaler_and_runs_forward_in_bf16() -> None:
    model = _model()
    ow = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype="bfloat16", clip_grad=dict(max_norm=1.0))
    assert ow.precision.scaler is None
    assert ow.loss_scale is None
    with ow.optim_context(model):
        assert model(torch.ones(1, 6)).dtype == torch.bfloat16
    before = model[0].weight.detach().clone()
    ow.update_params(_loss(model, ow))
    assert not torch.equal(before, model[0].weight)
    assert model[0].weight.dtype == torch.float32 and model[0].weight.grad is None
    assert ow.state_dict()["precision"] == {}
    assert "scaler" not in ow.state_dict()["precision"]


def test_scaler_state_round_trips_through_wrapper_state_dict() -> None:
    model = _model()
    ow = AmpOptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1), loss_scale=dict(init_scale=64.0, growth_interval=2)
    )
    for _ in range(3):
        ow.update_params(_loss(model, ow))
    state = ow.state_dict()
    assert state["precision"]["scaler"]["scale"] == 128.0 and state["precision"]["scaler"]["_growth_tracker"] == 1
    fresh = AmpOptimWrapper(torch.optim.SGD(_model().parameters(), lr=0.1))
    fresh.load_state_dict(state)
    s = fresh.precision.scaler
    assert (s.get_scale(), s._get_growth_tracker(), s.get_growth_interval()) == (128.0, 1, 2)


def test_state_in_mmengines_layout_keeps_its_loss_scale_and_base_lr() -> None:
    """mmengine's AmpOptimWrapper saves the optimizer's own keys with ``loss_scaler`` and ``base_param_settings``
    beside them."""
    model = _model()
    groups = [dict(params=model[0].parameters(), lr=0.2), dict(params=model[1].parameters())]
    ow = AmpOptimWrapper(torch.optim.SGD(groups, lr=0.1), loss_scale=dict(init_scale=512.0, growth_interval=100))
    ow.update_params(_loss(model, ow))
    ow.base_param_settings["lr"] = 0.05  # what a scheduler moved
    ours = ow.state_dict()
    mmengine_state = {
        **ours["optimizer"],
        "loss_scaler": ours["precision"]["scaler"],
        "base_param_settings": ours["base_param_settings"],
    }
    fresh = AmpOptimWrapper(
        torch.optim.SGD(
            [dict(params=g["params"], lr=0.2 if i == 0 else 0.1) for i, g in enumerate(ow.optimizer.param_groups)],
            lr=0.1,
        )
    )
    fresh.load_state_dict(mmengine_state)
    assert fresh.precision.scaler.get_scale() == 512.0  # not the default 65536
    assert fresh.get_lr()["base_lr"] == [0.05]
    assert fresh.optimizer.state_dict()["state"].keys() == ours["optimizer"]["state"].keys()


def test_accumulation_under_fp16_equals_one_big_batch() -> None:
    """Scaled micro-batch losses, divided by the window size, give the full-batch update."""
    model, ref = _model(), _model()
    ow = AmpOptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2, loss_scale=dict(init_scale=2.0**8)
    )
    ref_ow = AmpOptimWrapper(torch.optim.SGD(ref.parameters(), lr=0.1), loss_scale=dict(init_scale=2.0**8))
    x, y = _batch()
    for sl in (slice(0, 4), slice(4, 8)):
        with ow.optim_context(model):
            loss = F.cross_entropy(model(x[sl]), y[sl])
        ow.update_params(loss)
    with ref_ow.optim_context(ref):
        loss = F.cross_entropy(ref(x), y)
    ref_ow.update_params(loss)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_amp_wrapper_rejects_a_second_precision() -> None:
    model = _model()
    with pytest.raises(TypeError, match="precision"):
        AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), precision=MixedPrecision("float16"))


# -- builder: one precision, conflicts are errors -------------------------------------------
def _cfg(**kw) -> dict:
    return dict(optimizer=dict(type="SGD", lr=0.1), **kw)


def test_builder_plain_wrapper_uses_the_trainer_precision_object() -> None:
    p = MixedPrecision("bfloat16", "cpu")
    ow = build_optim_wrapper(_model(), _cfg(), p, "cpu")
    assert type(ow) is OptimWrapper and ow.precision is p


def test_builder_amp_config_with_default_precision_keeps_its_dtype() -> None:
    ow = build_optim_wrapper(_model(), _cfg(type="AmpOptimWrapper", dtype="bfloat16"), "32", "cpu")
    assert ow.precision.dtype == torch.bfloat16
    same = build_optim_wrapper(_model(), _cfg(type="AmpOptimWrapper", dtype="float16"), "16-mixed", "cpu")
    assert same.precision.dtype == torch.float16


def test_builder_conflicting_dtype_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="Conflicting mixed precision.*one place"):
        build_optim_wrapper(_model(), _cfg(type="AmpOptimWrapper", dtype="float16"), "bf16-mixed", "cpu")
    model = _model()
    ow = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype="bfloat16")
    with pytest.raises(ValueError, match="Conflicting"):
        build_optim_wrapper(model, ow, "16-mixed", "cpu")


def test_builder_amp_keys_need_amp_wrapper() -> None:
    with pytest.raises(KeyError, match="AmpOptimWrapper"):
        build_optim_wrapper(_model(), _cfg(dtype="float16"), None, "cpu")


def test_builder_prebuilt_fp32_wrapper_adopts_trainer_precision() -> None:
    model = _model()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    p = MixedPrecision("float16", "cpu")
    assert build_optim_wrapper(model, ow, p, "cpu") is ow and ow.precision is p


def test_builder_several_optimizers_get_their_own_scalers() -> None:
    class GAN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.generator, self.discriminator = nn.Linear(2, 2), nn.Linear(2, 1)

    owd = build_optim_wrapper(GAN(), dict(generator=_cfg(), discriminator=_cfg()), "16-mixed", "cpu")
    assert isinstance(owd, OptimWrapperDict)
    g, d = owd["generator"].precision, owd["discriminator"].precision
    assert g.dtype == d.dtype == torch.float16
    assert g.scaler is not d.scaler


@pytest.mark.parametrize("dtype", ["float32", torch.float32])
def test_float32_dtype_is_accepted_and_trains_like_a_plain_loop(dtype) -> None:
    """mmengine's AmpOptimWrapper(dtype='float32'): on CPU no autocast (torch has none for it there), no GradScaler."""
    model, ref = _model(), _model()
    ow = AmpOptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), dtype=dtype, clip_grad=dict(max_norm=0.5)
    )
    assert ow.precision.scaler is None and ow.loss_scale is None
    assert ow.context_free  # nothing to enter per step
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    x, y = _batch()
    for _ in range(3):
        ow.update_params(_loss(model, ow))
        F.cross_entropy(ref(x), y).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_float64_dtype_trains_a_double_model_and_says_cpu_has_no_float64_autocast() -> None:
    model, ref = _model().double(), _model().double()
    with pytest.warns(UserWarning, match="dtype=float64 on 'cpu'.*model.double"):
        ow = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype="float64")
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = _batch()
    for _ in range(2):
        with ow.optim_context(model):
            loss = F.cross_entropy(model(x.double()), y)
        assert loss.dtype == torch.float64
        ow.update_params(loss)
        F.cross_entropy(ref(x.double()), y).backward()
        opt.step()
        opt.zero_grad()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_float32_dtype_loss_scale_is_ignored_with_a_warning_and_precision_conflicts_are_named() -> None:
    model = _model()
    with pytest.warns(UserWarning, match="loss_scale=512.0 is ignored for '32-autocast'"):
        AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype="float32", loss_scale=512.0)
    with pytest.raises(ValueError, match="Conflicting mixed precision.*'32-autocast'"):
        build_optim_wrapper(
            model,
            dict(type="AmpOptimWrapper", dtype="float32", optimizer=dict(type="SGD", lr=0.1)),
            precision="bf16-mixed",
        )
    with pytest.raises(ValueError, match="Did you mean 'float32'"):
        AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype="float23")
    # on CUDA torch.autocast takes float32 / float64 (matmul-like ops run in that dtype): the context is entered there
    assert MixedPrecision(torch.float64, "cuda").autocasts and not MixedPrecision(torch.float32, "cpu").autocasts
