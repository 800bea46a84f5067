"""OptimWrapper: clipping equals torch.nn.utils, read-outs, builders, sync hook point, OptimWrapperDict."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import LinearReg, regression_set
from torch import nn

from trainwright.optim import OptimWrapper, OptimWrapperDict, build_optim_wrapper
from trainwright.optim.engine import UpdateEngine


def _two_layer(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _loss(model: nn.Module) -> torch.Tensor:
    x, y = regression_set(16, d_out=2).tensors
    return F.mse_loss(model(x), y) * 50.0  # large gradients so clipping is active


@pytest.mark.parametrize("norm_type", [2.0, float("inf"), 1.0])
def test_clip_by_norm_equals_torch(norm_type):
    model = _two_layer()
    ref = copy.deepcopy(model)
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), clip_grad=dict(max_norm=0.5, norm_type=norm_type))
    ow.update_params(_loss(model))

    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    _loss(ref).backward()
    total = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=0.5, norm_type=norm_type)
    opt.step()

    assert total > 0.5, "the test must actually clip"
    assert isinstance(ow.grad_norm, torch.Tensor)
    torch.testing.assert_close(ow.grad_norm, total, atol=0, rtol=0)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_clip_by_value_equals_torch():
    model = _two_layer()
    ref = copy.deepcopy(model)
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), clip_grad=dict(type="value", clip_value=0.05))
    ow.backward(_loss(model))
    ow.step()
    clipped = [p.grad.clone() for p in model.parameters()]

    _loss(ref).backward()
    assert max(p.grad.abs().max() for p in ref.parameters()) > 0.05, "the test must actually clip"
    torch.nn.utils.clip_grad_value_(ref.parameters(), 0.05)
    for g, p in zip(clipped, ref.parameters()):
        torch.testing.assert_close(g, p.grad, atol=0, rtol=0)
    expected_norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ref.parameters()]))
    torch.testing.assert_close(ow.grad_norm, expected_norm)


def test_clip_error_if_nonfinite():
    model = _two_layer()
    ow = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1), clip_grad=dict(max_norm=1.0, error_if_nonfinite=True)
    )
    with pytest.raises(RuntimeError, match="non-finite"):
        ow.update_params(_loss(model) * float("nan"))


@pytest.mark.parametrize(
    ("clip_grad", "hint"),
    [
        (dict(max_nrom=1.0), "max_norm"),
        (dict(max_norm=1.0, norm_typ=2), "norm_type"),
        (dict(type="value", clip_valeu=0.1), "clip_value"),
    ],
)
def test_wrong_clip_grad_keys_say_did_you_mean(clip_grad, hint):
    model = _two_layer()
    with pytest.raises(ValueError, match=f"Did you mean '{hint}'"):
        OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), clip_grad=clip_grad)


def test_clip_grad_missing_required_key_names_it():
    model = _two_layer()
    with pytest.raises(ValueError, match="needs 'clip_value'"):
        OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), clip_grad=dict(type="value"))


def test_get_lr_and_momentum_sgd_and_adam():
    model = _two_layer()
    sgd = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    assert sgd.get_lr() == {"lr": [0.1]} and sgd.get_momentum() == {"momentum": [0.9]}
    adam = OptimWrapper(torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.8, 0.99)))
    assert adam.get_lr() == {"lr": [1e-3]} and adam.get_momentum() == {"momentum": [0.8]}


@pytest.mark.parametrize("name", ["Adagrad", "RMSprop", "AdamW", "NAdam"])
def test_build_any_torch_optimizer_by_name(name):
    model = _two_layer()
    ow = build_optim_wrapper(model, dict(optimizer=dict(type=name, lr=0.01), accumulative_counts=2))
    assert type(ow.optimizer) is getattr(torch.optim, name)
    assert ow.accumulative_counts == 2
    assert {id(p) for p in ow.optimizer.param_groups[0]["params"]} == {id(p) for p in model.parameters()}


def test_build_unknown_optimizer_suggests_close_match():
    with pytest.raises(KeyError, match="Did you mean 'SGD'"):
        build_optim_wrapper(_two_layer(), dict(optimizer=dict(type="SDG", lr=0.1)))


def test_build_unknown_wrapper_key_suggests_close_match():
    with pytest.raises(KeyError, match="Did you mean 'accumulative_counts'"):
        build_optim_wrapper(_two_layer(), dict(optimizer=dict(type="SGD", lr=0.1), accumulative_count=2))


@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_accumulative_counts_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="accumulative_counts must be an int >= 1"):
        OptimWrapper(torch.optim.SGD(_two_layer().parameters(), lr=0.1), accumulative_counts=bad)


def test_optim_context_suppresses_sync_inside_window_only():
    """The DDP hook point: a strategy's no_sync context is entered for every micro-batch except the one closing a
    window."""
    model = LinearReg()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=3)
    entered: list[int] = []

    @contextlib.contextmanager
    def no_sync(m):
        assert m is model
        entered.append(ow.inner_count)
        yield

    class Syncing(UpdateEngine):
        def no_sync_context(self):
            return no_sync

    ow.strategy = Syncing()
    ow.initialize_count_status(model, 0, 7)
    x, y = regression_set(14).tensors
    for i in range(7):
        with ow.optim_context(model):
            loss = F.mse_loss(model.linear(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2])
        ow.update_params(loss)
    # windows [0,3) [3,6) [6,7): syncing micro-batches are 2, 5 and 6
    assert entered == [0, 1, 3, 4]


def test_optim_wrapper_dict_read_outs_and_state():
    g, d = _two_layer(0), _two_layer(1)
    owd = OptimWrapperDict(
        generator=OptimWrapper(torch.optim.SGD(g.parameters(), lr=0.1)),
        discriminator=OptimWrapper(torch.optim.Adam(d.parameters(), lr=0.01)),
    )
    assert owd.get_lr() == {"generator.lr": [0.1], "discriminator.lr": [0.01]}
    assert owd.get_momentum() == {"generator.momentum": [0], "discriminator.momentum": [0.9]}
    assert owd.param_groups == {
        "generator": owd["generator"].param_groups,
        "discriminator": owd["discriminator"].param_groups,
    }
    assert set(owd.state_dict()) == {"generator", "discriminator"}
    with pytest.raises(
        KeyError,
        match="No optim wrapper named 'generater'; the wrappers are \\['generator', 'discriminator'\\]. Did you mean "
        "'generator'",
    ):
        owd["generater"]
    with pytest.raises(KeyError, match="Did you mean 'generator'"):
        owd["gen"]  # a prefix of one name
    with pytest.raises(KeyError, match="lacks optim wrapper state"):
        owd.load_state_dict({"generator": owd["generator"].state_dict()})
    with pytest.raises(TypeError):
        OptimWrapperDict(generator=torch.optim.SGD(g.parameters(), lr=0.1))


def test_optim_wrapper_dict_refuses_the_per_optimizer_steps_and_points_to_one() -> None:
    g, d = _two_layer(0), _two_layer(1)
    owd = OptimWrapperDict(
        generator=OptimWrapper(torch.optim.SGD(g.parameters(), lr=0.1)),
        discriminator=OptimWrapper(torch.optim.SGD(d.parameters(), lr=0.1)),
    )
    loss = _loss(g)
    for call in (
        lambda: owd.update_params(loss),
        lambda: owd.backward(loss),
        lambda: owd.step(),
        lambda: owd.optim_context(g),
    ):
        with pytest.raises(
            NotImplementedError,
            match=r"optim_wrapper\['generator'\]\.\w+\(\.\.\.\).*names: \['generator', 'discriminator'\]",
        ):
            call()
    assert g[0].weight.grad is None  # nothing was back-propagated
    _loss(g).backward()
    owd.zero_grad()  # mmengine: zero_grad reaches every wrapper
    assert all(p.grad is None for p in g.parameters())


def test_optim_wrapper_dict_reports_base_lr_of_a_paramwise_wrapper() -> None:
    class GAN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.generator, self.discriminator = _two_layer(0), _two_layer(1)

    owd = build_optim_wrapper(
        GAN(),
        dict(
            generator=dict(optimizer=dict(type="SGD", lr=0.1), paramwise_cfg=dict(bias_lr_mult=2.0)),
            discriminator=dict(optimizer=dict(type="SGD", lr=0.01)),
        ),
    )
    assert owd.get_lr() == {"generator.base_lr": [0.1], "generator.lr": [0.1, 0.2], "discriminator.lr": [0.01]}


def test_subclass_overrides_are_honoured_and_config_changes_take_effect() -> None:
    """The inlined full-precision update must not bypass a user's override or a later change of settings."""
    calls: list[str] = []

    class Logged(OptimWrapper):
        def step(self, **kwargs):
            calls.append("step")
            super().step(**kwargs)

    model = _two_layer()
    Logged(torch.optim.SGD(model.parameters(), lr=0.1)).update_params(_loss(model))
    assert calls == ["step"]

    # Clipping switched on after construction clips (equal to torch's own clipping).
    model, ref = _two_layer(), _two_layer()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    ow.clip_grad = dict(max_norm=0.5)
    ow.update_params(_loss(model))
    _loss(ref).backward()
    expected_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    assert torch.equal(ow.grad_norm, expected_norm)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)

    # skip_nonfinite switched on afterwards skips a NaN micro-batch.
    ow.skip_nonfinite = True
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(RuntimeWarning, match="non-finite"):
        ow.update_params(_loss(model) * float("nan"))
    assert ow.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
