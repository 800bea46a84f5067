"""``Registry.build``: mmengine's ``default_args=`` (cfg wins, ``type`` may come from the defaults) next to the plain-keyword form."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainwright.optim import OptimWrapper, build_optim_wrapper
from trainwright.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS, OPTIMIZERS, Registry


class Widget:
    def __init__(self, size: int, color: str = "red", owner: Any = None) -> None:
        self.size, self.color, self.owner = size, color, owner


class Gadget(Widget):
    pass


class Keeper:
    """A constructor that itself takes a parameter named ``default_args`` (mmcv's DefaultRunnerConstructor does)."""

    def __init__(self, default_args: Any = None) -> None:
        self.default_args = default_args


@pytest.fixture
def reg() -> Registry:
    r = Registry("widget")
    r.register(Widget)
    r.register(Gadget)
    r.register(Keeper)
    return r


def test_mmengine_default_args_fill_missing_keys(reg: Registry) -> None:
    w = reg.build(dict(type="Widget", size=3), default_args=dict(color="blue", owner="me"))
    assert type(w) is Widget and (w.size, w.color, w.owner) == (3, "blue", "me")


def test_cfg_wins_over_default_args(reg: Registry) -> None:
    w = reg.build(dict(type="Widget", size=3, color="green"), default_args=dict(size=9, color="blue"))
    assert (w.size, w.color) == (3, "green")
    # a type in both: the cfg's, and the default's type is not passed on to the constructor
    assert type(reg.build(dict(type="Gadget", size=1), default_args=dict(type="Widget"))) is Gadget


def test_type_from_default_args(reg: Registry) -> None:
    w = reg.build(dict(size=2), default_args=dict(type="Gadget", color="blue"))
    assert type(w) is Gadget and (w.size, w.color) == (2, "blue")
    assert type(reg.build(dict(size=2), default_args=dict(type=Widget))) is Widget  # a class works as well as a name
    assert type(reg.build(dict(size=2), type="Gadget")) is Gadget  # the plain-keyword form is the same defaults


def test_missing_type_names_both_places(reg: Registry) -> None:
    with pytest.raises(KeyError, match=r"needs a 'type' key, in the config or in default_args; got config keys \['size'\] and default keys \['color'\]"):
        reg.build(dict(size=2), default_args=dict(color="blue"))
    with pytest.raises(KeyError, match=r"in the config or in default_args; got config keys \['size'\] and no default_args"):
        reg.build(dict(size=2))


def test_plain_keyword_form_still_works(reg: Registry) -> None:
    w = reg.build(dict(type="Widget", size=3), color="blue")
    assert (w.size, w.color) == (3, "blue")
    assert reg.build(dict(type="Widget", size=3, color="green"), color="blue").color == "green"  # cfg wins here too


def test_plain_keyword_wins_over_default_args_on_a_clash(reg: Registry) -> None:
    w = reg.build(dict(type="Widget", size=3), default_args=dict(color="blue", owner="mm"), color="black")
    assert (w.color, w.owner) == ("black", "mm")


def test_objects_pass_through_whatever_the_defaults(reg: Registry) -> None:
    obj = Widget(1)
    assert reg.build(obj, default_args=dict(color="blue")) is obj and obj.color == "red"


def test_default_args_must_be_a_mapping(reg: Registry) -> None:
    with pytest.raises(TypeError, match=r"default_args must be a mapping.*default_args=dict\(default_args=\.\.\.\)"):
        reg.build(dict(type="Keeper"), default_args=["not", "a", "mapping"])


def test_a_constructor_parameter_named_default_args(reg: Registry) -> None:
    assert reg.build(dict(type="Keeper", default_args=dict(a=1))).default_args == dict(a=1)
    assert reg.build(dict(type="Keeper"), default_args=dict(default_args=dict(a=2))).default_args == dict(a=2)


def test_unknown_type_and_bad_argument_still_explained(reg: Registry) -> None:
    cfg = dict(type="Widgte", size=1)
    with pytest.raises(KeyError, match="Did you mean 'Widget'") as info:
        reg.build(cfg, default_args=dict(color="blue"))
    assert info.value.failed_config is cfg
    with pytest.raises(TypeError, match=r"Could not build widget 'Widget' from \{'size': 1\}.*'shape'"):
        reg.build(dict(size=1), default_args=dict(type="Widget", shape="round"))


def _model() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(3, 1)


def _steps(step: Any, model: nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x, y = torch.randn(5, 3, generator=g), torch.randn(5, 1, generator=g)
        step(F.mse_loss(model(x), y))


def _hand_written(accumulative_counts: int) -> nn.Linear:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    n = 0

    def step(loss: torch.Tensor) -> None:
        nonlocal n
        (loss / accumulative_counts).backward()
        n += 1
        if n % accumulative_counts == 0:
            opt.step()
            opt.zero_grad()

    _steps(step, model)
    return model


def test_optim_wrapper_built_mmengine_style_trains_like_a_hand_written_loop() -> None:
    model = _model()
    optimizer = OPTIMIZERS.build(dict(type="SGD", lr=0.1, momentum=0.9), default_args=dict(params=model.parameters()))
    ow = OPTIM_WRAPPERS.build(dict(type="OptimWrapper", accumulative_counts=2), default_args=dict(optimizer=optimizer))
    assert type(ow) is OptimWrapper and ow.optimizer is optimizer
    ow.initialize_count_status(model, 0, 4)
    _steps(ow.update_params, model)
    ref = _hand_written(accumulative_counts=2)
    assert torch.equal(model.weight, ref.weight) and torch.equal(model.bias, ref.bias)


@OPTIM_WRAPPER_CONSTRUCTORS.register
class MMEnginePortedConstructor:
    """An optim wrapper constructor as written for mmengine: builds through ``default_args=``, the type defaulted there."""

    def __init__(self, optim_wrapper_cfg: dict[str, Any], paramwise_cfg: dict[str, Any] | None = None) -> None:
        self.optim_wrapper_cfg = dict(optim_wrapper_cfg)
        self.optimizer_cfg = self.optim_wrapper_cfg.pop("optimizer")

    def __call__(self, model: nn.Module) -> OptimWrapper:
        optimizer = OPTIMIZERS.build(self.optimizer_cfg, default_args=dict(params=model.parameters()))
        return OPTIM_WRAPPERS.build(self.optim_wrapper_cfg, default_args=dict(type="OptimWrapper", optimizer=optimizer))


def test_mmengine_ported_constructor_through_build_optim_wrapper() -> None:
    model = _model()
    ow = build_optim_wrapper(model, dict(constructor="MMEnginePortedConstructor", optimizer=dict(type="SGD", lr=0.1, momentum=0.9), accumulative_counts=2))
    assert type(ow) is OptimWrapper and type(ow.optimizer) is torch.optim.SGD
    ow.initialize_count_status(model, 0, 4)
    _steps(ow.update_params, model)
    ref = _hand_written(accumulative_counts=2)
    assert torch.equal(model.weight, ref.weight) and torch.equal(model.bias, ref.bias)
