"""``Registry``: mmengine's ``build(cfg, default_args=...)`` (cfg wins, ``type`` may come from the defaults) next to the
plain-keyword form,
mmengine's ``register_module`` and its configs' ``_scope_`` keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import LinearReg, regression_set
from torch import nn

import trainwright as tw
from trainwright.optim import OptimWrapper, build_optim_wrapper, build_param_schedulers
from trainwright.registry import (
    DATASETS,
    MODELS,
    OPTIM_WRAPPER_CONSTRUCTORS,
    OPTIM_WRAPPERS,
    OPTIMIZERS,
    ConfigError,
    Registry,
)


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
    with pytest.raises(
        KeyError,
        match=r"needs a 'type' key, in the config or in default_args; got config keys \['size'\] and default keys "
        r"\['color'\]",
    ):
        reg.build(dict(size=2), default_args=dict(color="blue"))
    with pytest.raises(
        KeyError, match=r"in the config or in default_args; got config keys \['size'\] and no default_args"
    ):
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
    """An optim wrapper constructor as written for mmengine: builds through ``default_args=``, the type defaulted
    there."""

    def __init__(self, optim_wrapper_cfg: dict[str, Any], paramwise_cfg: dict[str, Any] | None = None) -> None:
        self.optim_wrapper_cfg = dict(optim_wrapper_cfg)
        self.optimizer_cfg = self.optim_wrapper_cfg.pop("optimizer")

    def __call__(self, model: nn.Module) -> OptimWrapper:
        optimizer = OPTIMIZERS.build(self.optimizer_cfg, default_args=dict(params=model.parameters()))
        return OPTIM_WRAPPERS.build(self.optim_wrapper_cfg, default_args=dict(type="OptimWrapper", optimizer=optimizer))


def test_mmengine_ported_constructor_through_build_optim_wrapper() -> None:
    model = _model()
    ow = build_optim_wrapper(
        model,
        dict(
            constructor="MMEnginePortedConstructor",
            optimizer=dict(type="SGD", lr=0.1, momentum=0.9),
            accumulative_counts=2,
        ),
    )
    assert type(ow) is OptimWrapper and type(ow.optimizer) is torch.optim.SGD
    ow.initialize_count_status(model, 0, 4)
    _steps(ow.update_params, model)
    ref = _hand_written(accumulative_counts=2)
    assert torch.equal(model.weight, ref.weight) and torch.equal(model.bias, ref.bias)


# ---- mmengine's register_module and _scope_ ---------------------------------------------------------------------


def test_register_module_as_decorator_returns_the_class() -> None:
    r = Registry("widget")

    @r.register_module()
    class Plain:
        pass

    @r.register_module(name="Renamed")
    class Original:
        pass

    assert r.get("Plain") is Plain and r.get("Renamed") is Original and "Original" not in r.names()


def test_register_module_under_several_names() -> None:
    r = Registry("widget")

    @r.register_module(name=["Foo", "Bar"])
    class Both:
        pass

    assert r.get("Foo") is Both and r.get("Bar") is Both and r.names() == ["Bar", "Foo"]
    assert type(r.build(dict(type="Bar"))) is Both
    r.register(Widget, name=("Small", "Little"))  # register takes the same names (any sequence of str, as mmengine)
    assert r.get("Small") is r.get("Little") is Widget


def test_register_module_with_module_registers_at_once() -> None:
    r = Registry("widget")
    assert r.register_module(module=Widget) is Widget and r.get("Widget") is Widget

    def make_gadget(size: int) -> Gadget:
        return Gadget(size)

    assert r.register_module(name="gadget", module=make_gadget) is make_gadget  # a function, as mmengine allows
    assert type(r.build(dict(type="gadget", size=2))) is Gadget


def test_register_module_force_replaces_and_a_clash_registers_nothing() -> None:
    r = Registry("widget")
    r.register_module(module=Widget, name="W")
    with pytest.raises(KeyError, match="'W' is already registered in the widget registry; pass force=True"):
        r.register_module(name=["Free", "W"], module=Gadget)
    assert "Free" not in r.names()  # no name of the list is taken when one clashes
    assert r.register_module(name="W", force=True)(Gadget) is Gadget and r.get("W") is Gadget


def test_register_module_errors_as_mmengine() -> None:
    r = Registry("widget", import_name="my.WIDGETS")
    with pytest.raises(TypeError, match="name must be None, a str or a list of str, got int"):
        r.register_module(name=3)
    with pytest.raises(TypeError, match="got list"):
        r.register_module(name=["Foo", 3])
    with pytest.raises(TypeError, match=r"got type; as a decorator, call it: @my.WIDGETS.register_module\(\)"):
        r.register_module(Widget)  # @r.register_module without parentheses
    with pytest.raises(TypeError, match="only a class or a function can be registered.*got int"):
        r.register_module(name="answer", module=42)
    with pytest.raises(TypeError, match="force must be a bool, got str"):
        r.register_module(force="yes")
    with pytest.raises(ValueError, match="empty list"):
        r.register_module(name=[])
    assert r.names() == []


def test_scope_is_dropped_for_a_known_type(reg: Registry) -> None:
    w = reg.build(dict(_scope_="mmdet", type="Widget", size=3))
    assert type(w) is Widget and w.size == 3
    assert (
        type(reg.build(dict(size=1), default_args=dict(_scope_="mmpretrain", type="Gadget"))) is Gadget
    )  # mmengine pops it from the defaults too


def test_unknown_type_with_a_scope_says_the_scope_is_ignored(reg: Registry) -> None:
    cfg = dict(_scope_="mmdet", type="Widgte", size=1)
    with pytest.raises(
        KeyError,
        match=r"Did you mean 'Widget'.*\(The config's _scope_='mmdet' is ignored: trainwright has one registry per "
        r"kind, so 'Widgte' must be registered in it .*custom_imports",
    ) as info:
        reg.build(cfg)
    assert info.value.failed_config is cfg
    with pytest.raises(KeyError) as plain:
        reg.build(dict(type="Widgte"))
    assert "_scope_" not in str(plain.value)


def test_a_nested_unknown_type_names_the_outer_scope(reg: Registry) -> None:
    @reg.register_module()
    class Holder:
        def __init__(self, part: dict[str, Any]) -> None:
            self.part = reg.build(part)

    assert type(reg.build(dict(_scope_="mmdet", type="Holder", part=dict(type="Widget", size=1))).part) is Widget
    with pytest.raises(KeyError, match=r"_scope_='mmdet' is ignored.*'Nope'") as info:
        reg.build(dict(_scope_="mmdet", type="Holder", part=dict(type="Nope")))
    assert str(info.value).count("is ignored") == 1
    with pytest.raises(
        KeyError, match=r"_scope_='mmpretrain' is ignored"
    ) as inner:  # the innermost scope is the one named
        reg.build(dict(_scope_="mmdet", type="Holder", part=dict(_scope_="mmpretrain", type="Nope")))
    assert "'mmdet'" not in str(inner.value)


def test_scope_is_dropped_from_optim_wrapper_and_param_scheduler_configs() -> None:
    # build_optim_wrapper and build_param_scheduler read the type and check the keys themselves, not through
    # Registry.build
    model = _model()
    ow = build_optim_wrapper(
        model,
        dict(
            _scope_="mmdet",
            type="OptimWrapper",
            optimizer=dict(_scope_="mmdet", type="SGD", lr=0.1),
            accumulative_counts=2,
        ),
    )
    assert type(ow) is OptimWrapper and type(ow.optimizer) is torch.optim.SGD and ow.optimizer.defaults["lr"] == 0.1
    [scheduler] = build_param_schedulers(
        [dict(_scope_="mmdet", type="MultiStepLR", milestones=[1], by_epoch=False)], ow
    )
    assert type(scheduler).__name__ == "MultiStepLR" and scheduler.milestones == {1: 1}
    # a genuinely unknown key beside _scope_ is still refused, named
    with pytest.raises(
        KeyError, match=r"Unknown optim_wrapper key 'acumulative_counts'. Did you mean 'accumulative_counts'\?"
    ) as info:
        build_optim_wrapper(
            model, dict(_scope_="mmdet", type="OptimWrapper", optimizer=dict(type="SGD", lr=0.1), acumulative_counts=2)
        )
    assert "_scope_" not in str(info.value)
    with pytest.raises(
        TypeError, match=r"MultiStepLR got unknown argument\(s\) \['milestone'\]. Did you mean 'milestones'\?"
    ) as bad:
        build_param_schedulers([dict(_scope_="mmdet", type="MultiStepLR", milestone=[1])], ow)
    assert "_scope_" not in str(bad.value)


def test_an_unknown_optim_wrapper_optimizer_or_scheduler_type_names_the_ignored_scope() -> None:
    model = _model()
    hint = (
        r"\(The config's _scope_='{}' is ignored: trainwright has one registry per kind, so '{}' must be registered in "
        r"it"
    )
    with pytest.raises(
        KeyError, match=r"Unknown optim wrapper type 'OptimWrapperr'.*" + hint.format("mmdet", "OptimWrapperr")
    ):
        build_optim_wrapper(model, dict(_scope_="mmdet", type="OptimWrapperr", optimizer=dict(type="SGD", lr=0.1)))
    with pytest.raises(
        KeyError,
        match=r"Unknown optim wrapper constructor type 'LayerDecayOptimizerConstructor'.*"
        + hint.format("mmdet", "LayerDecayOptimizerConstructor"),
    ):
        build_optim_wrapper(
            model,
            dict(_scope_="mmdet", constructor="LayerDecayOptimizerConstructor", optimizer=dict(type="SGD", lr=0.1)),
        )
    with pytest.raises(KeyError, match=r"Unknown optimizer type 'SGDD'.*" + hint.format("mmdet", "SGDD")):
        build_optim_wrapper(model, dict(optimizer=dict(_scope_="mmdet", type="SGDD", lr=0.1)))
    with pytest.raises(
        KeyError, match=hint.format("mmdet", "SGDD")
    ):  # the optimizer's type, built while building the wrapper
        build_optim_wrapper(model, dict(_scope_="mmdet", optimizer=dict(type="SGDD", lr=0.1)))
    with pytest.raises(
        KeyError, match=hint.format("mmpretrain", "SGDD")
    ) as inner:  # the innermost scope is the one named
        build_optim_wrapper(model, dict(_scope_="mmdet", optimizer=dict(_scope_="mmpretrain", type="SGDD", lr=0.1)))
    assert str(inner.value).count("is ignored") == 1
    ow = build_optim_wrapper(model, dict(optimizer=dict(type="SGD", lr=0.1)))
    with pytest.raises(
        KeyError,
        match=r"Unknown param scheduler type 'MultiStepLRR'. Did you mean 'MultiStepLR'.*"
        + hint.format("mmdet", "MultiStepLRR"),
    ):
        build_param_schedulers([dict(_scope_="mmdet", type="MultiStepLRR", milestones=[1])], ow)
    with pytest.raises(KeyError) as plain:
        build_param_schedulers([dict(type="MultiStepLRR", milestones=[1])], ow)
    assert "_scope_" not in str(plain.value)


@pytest.fixture
def scratch_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """MODELS and DATASETS with their current entries, restored after the test: its classes stay out of the global
    tables."""
    monkeypatch.setattr(MODELS, "_table", dict(MODELS._table))
    monkeypatch.setattr(DATASETS, "_table", dict(DATASETS._table))


def _mmengine_config(work_dir: Path, model_type: str = "PortedRegressor") -> dict[str, Any]:
    return dict(
        default_scope="mmdet",
        model=dict(_scope_="mmdet", type=model_type, d_in=4),
        train_dataloader=dict(
            batch_size=4,
            num_workers=0,
            sampler=dict(type="DefaultSampler", shuffle=False),
            collate_fn=dict(type="default_collate"),  # (mmengine's default would be pseudo_collate)
            dataset=dict(_scope_="mmdet", type="RegressionSet", n=16),
        ),
        optim_wrapper=dict(type="OptimWrapper", optimizer=dict(type="SGD", lr=0.05)),
        train_cfg=dict(type="EpochBasedTrainLoop", max_epochs=1),
        default_hooks=dict(checkpoint=None),
        log_level="WARNING",
        randomness=dict(seed=0),
        work_dir=str(work_dir),
    )


@pytest.mark.usefixtures("scratch_registries")
def test_mmengine_style_config_with_scopes_trains_like_objects(tmp_path: Path, trainer_factory: Any) -> None:
    @MODELS.register_module()
    class PortedRegressor(LinearReg):
        pass

    DATASETS.register_module(name="RegressionSet", module=regression_set)
    with pytest.warns(UserWarning, match="default_scope.*ignored"):
        trainer = tw.Trainer.from_config(_mmengine_config(tmp_path / "cfg"))
    try:
        assert type(trainer.unwrapped_model) is PortedRegressor
        trainer.train()
        assert trainer.progress.epoch == 1 and trainer.progress.iteration == 4
        # the same run from objects: the scopes changed nothing
        ref = trainer_factory(model=LinearReg(d_in=4), dataset=regression_set(n=16), batch_size=4)
        ref.train()
        assert all(
            torch.equal(a, b)
            for a, b in zip(trainer.unwrapped_model.parameters(), ref.unwrapped_model.parameters(), strict=True)
        )
        assert not torch.equal(trainer.unwrapped_model.linear.weight, LinearReg(d_in=4).linear.weight)  # it did train
    finally:
        trainer.close()


@pytest.mark.usefixtures("scratch_registries")
def test_unknown_type_in_a_config_names_the_ignored_scopes(tmp_path: Path) -> None:
    DATASETS.register_module(name="RegressionSet", module=regression_set)
    cfg = _mmengine_config(tmp_path, model_type="FasterRCNN")
    ignored = pytest.warns(
        UserWarning, match=r"Config keys \['default_scope'\] are mmengine runtime settings trainwright does not use"
    )
    with (
        ignored,
        pytest.raises(
            ConfigError,
            match=r"Building 'model' from the config failed: Unknown model type 'FasterRCNN'"
            r".*_scope_='mmdet' is ignored",
        ) as info,
    ):
        tw.Trainer.from_config(cfg)
    assert "default_scope" not in str(info.value)  # the config's own _scope_ is the one that applied, as in mmengine
    del cfg["model"]["_scope_"]  # type: ignore[attr-defined]
    with (
        ignored,
        pytest.raises(
            ConfigError,
            match=r"Unknown model type 'FasterRCNN'.*The config's default_scope='mmdet' is ignored: trainwright has "
            r"one registry per kind",
        ),
    ):
        tw.Trainer.from_config(cfg)
    cfg["model"]["type"] = "mmdet.FasterRCNN"  # type: ignore[index]  # a scoped type name is the innermost scope
    with (
        ignored,
        pytest.raises(
            ConfigError,
            match=r"Unknown model type 'mmdet.FasterRCNN'.*The scope 'mmdet' of type='mmdet.FasterRCNN' is ignored",
        ) as scoped,
    ):
        tw.Trainer.from_config(cfg)
    assert "default_scope" not in str(scoped.value)


def test_scoped_type_names_are_looked_up_without_their_scope(reg: Registry) -> None:
    """mmengine's ``type='mmdet.RetinaNet'`` (scope, dot, name) builds the registered name, as a ``_scope_`` key is
    dropped."""
    w = reg.build(dict(type="mmdet.Widget", size=3))
    assert type(w) is Widget and w.size == 3
    assert "mmpretrain.Gadget" in reg and type(reg.get("mmpretrain.Gadget")(size=1)) is Gadget
    reg.register(Keeper, name="my.Keeper")  # a name registered with a dot is found as written
    assert reg.get("my.Keeper") is Keeper
    with pytest.raises(
        KeyError,
        match=r"Unknown widget type 'mmdet.Widgte'\. Did you mean 'Widget'.*\(The scope 'mmdet' of type='mmdet.Widgte' "
        r"is ignored: trainwright has one registry per kind, so 'Widgte' must be registered",
    ) as info:
        reg.build(dict(_scope_="mmpretrain", type="mmdet.Widgte", size=1))
    assert "mmpretrain" not in str(info.value)  # the type's own scope is the innermost one, as in mmengine
    for odd in ("Widget.", ".Widget"):  # no scope or no name around the dot: looked up as written
        with pytest.raises(KeyError, match=f"Unknown widget type {odd!r}") as plain:
            reg.get(odd)
        assert "is ignored" not in str(plain.value)


@pytest.mark.usefixtures("scratch_registries")
def test_a_list_of_model_configs_builds_an_nn_sequential() -> None:
    """mmengine's ``build_model_from_cfg``: a list config in MODELS builds each item (same defaults) into an
    ``nn.Sequential``."""

    @MODELS.register_module()
    class Scale(nn.Module):
        def __init__(self, factor: float, bias: float = 0.0) -> None:
            super().__init__()
            self.factor, self.bias = factor, bias

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.factor + self.bias

    seq = MODELS.build(
        [dict(type="Scale", factor=2.0), dict(type="mmdet.Scale", factor=3.0, bias=1.0), nn.ReLU()],
        default_args=dict(bias=0.5),
    )
    assert isinstance(seq, nn.Sequential) and [type(m) for m in seq] == [Scale, Scale, nn.ReLU]
    assert [(m.factor, m.bias) for m in seq[:2]] == [
        (2.0, 0.5),
        (3.0, 1.0),
    ]  # the defaults fill each item; an item's own value wins
    x = torch.tensor([-1.0, 0.0, 2.0])
    assert torch.equal(seq(x), torch.relu((x * 2.0 + 0.5) * 3.0 + 1.0))
    assert isinstance(MODELS.build([[dict(type="Scale", factor=1.0)]])[0], nn.Sequential)  # nested lists nest
    assert DATASETS.build([1, 2]) == [1, 2]  # other registries return a list unchanged, like any non-mapping


def _without_scopes(value: Any) -> Any:
    """``value`` with every ``_scope_`` key left out, at any depth."""
    if isinstance(value, dict):
        return {k: _without_scopes(v) for k, v in value.items() if k != "_scope_"}
    if isinstance(value, list):
        return [_without_scopes(v) for v in value]
    return value


@pytest.mark.usefixtures("scratch_registries")
def test_scopes_in_optim_wrapper_optimizer_scheduler_and_loops_train_as_without_them(tmp_path: Path) -> None:
    @MODELS.register_module()
    class PortedRegressor(LinearReg):
        pass

    DATASETS.register_module(name="RegressionSet", module=regression_set)
    cfg = _mmengine_config(tmp_path / "scoped")
    cfg["optim_wrapper"] = dict(
        _scope_="mmdet", type="OptimWrapper", optimizer=dict(_scope_="mmdet", type="SGD", lr=0.05)
    )
    # 4 iterations: lr 0.05 for the first two, 0.005 after
    cfg["param_scheduler"] = [dict(_scope_="mmdet", type="MultiStepLR", by_epoch=False, milestones=[2], gamma=0.1)]
    # the loops' typed configs (mmengine's LOOPS registry) as a config inheriting across packages (_base_ =
    # 'mmdet::...') dumps them
    cfg["train_cfg"] = dict(_scope_="mmdet", type="EpochBasedTrainLoop", max_epochs=1)
    cfg["val_cfg"] = dict(_scope_="mmdet", type="ValLoop")
    plain = _without_scopes(cfg) | dict(work_dir=str(tmp_path / "plain"))
    assert (
        "_scope_" not in repr(plain) and repr(cfg).count("_scope_") == 7
    )  # model, dataset, optim_wrapper, optimizer, param_scheduler, train_cfg, val_cfg
    trainers = []
    try:
        for c in (cfg, plain):
            with pytest.warns(UserWarning, match="default_scope.*ignored"):
                trainers.append(tw.Trainer.from_config(c))
            trainers[-1].train()
        scoped, ref = trainers
        assert (
            type(scoped.unwrapped_model) is PortedRegressor and scoped.progress.iteration == ref.progress.iteration == 4
        )
        assert [g["lr"] for g in scoped.optim_wrapper.optimizer.param_groups] == pytest.approx(
            [0.005]
        )  # the scheduler ran
        assert all(
            torch.equal(a, b)
            for a, b in zip(scoped.unwrapped_model.parameters(), ref.unwrapped_model.parameters(), strict=True)
        )
        assert [g["lr"] for g in ref.optim_wrapper.optimizer.param_groups] == [
            g["lr"] for g in scoped.optim_wrapper.optimizer.param_groups
        ]
        assert not torch.equal(scoped.unwrapped_model.linear.weight, LinearReg(d_in=4).linear.weight)  # it did train
    finally:
        for t in trainers:
            t.close()


# ----------------------------------------------------------------------------- mmengine's registry tree, build_func,
# locations


def test_child_registry_with_scope_falls_back_to_its_parent_and_is_found_by_scope() -> None:
    root = Registry("thing", scope="rootpkg")
    child = Registry("thing", parent=root, scope="mine")

    @root.register()
    class Base:
        pass

    @child.register()
    class Mine:
        def __init__(self, k: int = 0) -> None:
            self.k = k

    assert child.get("Base") is Base  # a child looks up what it lacks in its parent
    assert "Mine" not in root and root.get("mine.Mine") is Mine  # the parent finds a child's name by its scope
    assert isinstance(root.build(dict(type="mine.Mine", k=3)), Mine) and child.build(dict(type="Mine", k=2)).k == 2
    assert root.children == {"mine": child} and child.parent is root
    assert Registry.split_scope_key("mine.Mine") == ("mine", "Mine") and Registry.split_scope_key("Mine") == (
        None,
        "Mine",
    )
    with pytest.raises(KeyError, match="has a child of scope 'mine' already"):
        Registry("thing", parent=root, scope="mine")


def test_scope_defaults_to_the_callers_package() -> None:
    assert Registry("x").scope == __name__.split(".")[0]


def test_build_func_replaces_the_build_and_children_inherit_it() -> None:
    from trainwright.registry import build_from_cfg

    calls = []

    def build_func(cfg: Any, registry: Registry, default_args: Any = None, **kwargs: Any) -> Any:
        calls.append(cfg["type"])
        return build_from_cfg(cfg, registry, default_args=default_args, **kwargs)

    root = Registry("thing", scope="r2", build_func=build_func)
    child = Registry("thing", parent=root, scope="c2")
    child.register(dict, name="D")
    assert child.build(dict(type="D", a=1)) == {"a": 1} and calls == ["D"]


def test_locations_are_imported_at_the_first_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reg = Registry("thing", scope="loc", locations=["tw_lazy_components"])
    (tmp_path / "tw_lazy_components.py").write_text(
        "from tests_registry_target import REG\n@REG.register()\nclass Lazy:\n    pass\n"
    )
    target = tmp_path / "tests_registry_target.py"
    target.write_text("REG = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import tests_registry_target  # type: ignore[import-not-found]

    tests_registry_target.REG = reg
    assert type(reg.build(dict(type="Lazy"))).__name__ == "Lazy"


def test_import_modules_from_strings() -> None:
    from trainwright.registry import import_modules_from_strings

    assert import_modules_from_strings("json").__name__ == "json"
    assert [m.__name__ for m in import_modules_from_strings(["os", "json"])] == ["os", "json"]
    with pytest.warns(UserWarning, match="no_such_mod_tw failed to import"):
        assert import_modules_from_strings(["no_such_mod_tw"], allow_failed_imports=True) == [None]
    with pytest.raises(ImportError):
        import_modules_from_strings("no_such_mod_tw")


def test_a_name_scoped_two_levels_deep_resolves_in_the_registry_tree() -> None:
    """mmengine's ``REG.get('a.b.Name')``: Name in the registry of scope b, a child of the registry of scope a."""
    root = Registry("thing", scope="root_two_levels")
    mid = Registry("thing", parent=root, scope="a")
    leaf = Registry("thing", parent=mid, scope="b")

    @leaf.register()
    class Name:
        pass

    assert root.get("a.b.Name") is Name and mid.get("b.Name") is Name and leaf.get("a.b.Name") is Name
    assert type(root.build(dict(type="a.b.Name"))) is Name
    with pytest.raises(KeyError, match=r"Unknown thing type 'a.b.Nmae'"):
        root.get("a.b.Nmae")


_STOCK_CHECK = """
import json, pkgutil, importlib
import trainwright
import trainwright.registry as r

regs = [r.OPTIM_WRAPPERS, r.OPTIM_WRAPPER_CONSTRUCTORS, r.PARAM_SCHEDULERS, r.HOOKS, r.METRICS, r.STRATEGIES, r.MODELS,
        r.DATASETS, r.FUNCTIONS]
out = {"missing": [], "unlisted": {}}
for reg in regs:  # each listed name is found, importing its module alone
    for name in r.STOCK_LOCATIONS[reg.name]:
        try:
            reg.get(name)
        except KeyError:
            out["missing"].append(f"{reg.name}:{name}")
for info in pkgutil.walk_packages(trainwright.__path__, "trainwright."):  # then every module: nothing registers more
    if not info.name.startswith(("trainwright.cli", "trainwright.__main__")):
        importlib.import_module(info.name)
for reg in regs:
    extra = sorted(set(reg.names()) - set(r.STOCK_LOCATIONS[reg.name]))
    if extra:
        out["unlisted"][reg.name] = extra
print(json.dumps(out))
"""


def test_every_stock_component_is_listed_where_it_registers(tmp_path: Path) -> None:
    """``STOCK_LOCATIONS`` is complete and right: each name is found by importing its listed module only, and importing
    every module of trainwright registers no stock name it lacks (a new component must be listed to be found lazily)."""
    import json
    import os
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-c", _STOCK_CHECK],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["missing"] == [] and out["unlisted"] == {}


def test_a_mapping_of_locations_imports_only_the_module_of_the_name_looked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tw_loc_target.py").write_text("REG = None\n")
    for module, cls in (("tw_loc_a", "A"), ("tw_loc_b", "B")):
        (tmp_path / f"{module}.py").write_text(
            f"from tw_loc_target import REG\n@REG.register()\nclass {cls}:\n    pass\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    import sys

    import tw_loc_target  # type: ignore[import-not-found]

    reg = Registry("thing", scope="locmap", locations={"A": "tw_loc_a", "B": "tw_loc_b"})
    tw_loc_target.REG = reg
    assert type(reg.build(dict(type="A"))).__name__ == "A"
    assert "tw_loc_a" in sys.modules and "tw_loc_b" not in sys.modules
    # a registration from outside the scope under a listed name loads that name's module first: the clash is reported
    with pytest.raises(KeyError, match="'B' is already registered in the thing registry"):
        reg.register(type("B", (), {}), name="B")
    assert reg.names() == ["A", "B"]
