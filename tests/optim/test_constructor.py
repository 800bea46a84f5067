"""DefaultOptimWrapperConstructor / paramwise_cfg: per-parameter lr and weight decay equal the hand-computed values;
training equals a hand-written loop."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw
from trainwright.optim import DefaultOptimWrapperConstructor, OptimWrapper, build_optim_wrapper
from trainwright.registry import OPTIM_WRAPPER_CONSTRUCTORS

LR, WD = 0.1, 0.01


class Net(tw.BaseModel):
    """Conv, BatchNorm, depthwise conv, LayerNorm, Linear, a 1-d parameter and a frozen one."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Module()
        self.backbone.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.backbone.bn = nn.BatchNorm2d(4)
        self.backbone.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.norm = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 2)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4))
        self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        b = self.backbone
        h = b.dw(F.relu(b.bn(b.conv(x)))).mean(dim=(2, 3)) * self.scale
        out = self.fc(self.norm(h))
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


PARAMWISE = dict(
    bias_lr_mult=2.0,
    bias_decay_mult=0.5,
    norm_decay_mult=0.0,
    dwconv_decay_mult=0.1,
    flat_decay_mult=0.3,
    custom_keys={"fc": dict(lr_mult=0.1, decay_mult=2.0), "fc.bias": dict(lr_mult=0.01)},
)

#: name -> (lr, weight_decay), by mmengine's rules worked out by hand.
EXPECTED = {
    "backbone.conv.weight": (LR, WD),
    "backbone.conv.bias": (LR * 2.0, WD * 0.5),  # bias_lr_mult, bias_decay_mult
    "backbone.bn.weight": (LR, WD * 0.0),  # norm_decay_mult
    "backbone.bn.bias": (LR, WD * 0.0),  # a norm layer's bias: no bias_lr_mult; norm_decay_mult wins
    "backbone.dw.weight": (LR, WD * 0.1),  # dwconv_decay_mult
    "backbone.dw.bias": (LR * 2.0, WD * 0.5),  # bias rules come before the depthwise rule (mmengine >= 0.7)
    "norm.weight": (LR, WD * 0.0),
    "norm.bias": (LR, WD * 0.0),
    "fc.weight": (LR * 0.1, WD * 2.0),  # custom key "fc"
    "fc.bias": (LR * 0.01, WD),  # the longer custom key "fc.bias"; its decay_mult defaults to 1
    "scale": (LR, WD * 0.3),  # 1-d: flat_decay_mult
}


def _cfg(**paramwise: Any) -> dict[str, Any]:
    return dict(
        optimizer=dict(type="SGD", lr=LR, weight_decay=WD, momentum=0.9), paramwise_cfg={**PARAMWISE, **paramwise}
    )


def _options(ow: OptimWrapper) -> dict[str, tuple[float, float]]:
    return {n: (g["lr"], g["weight_decay"]) for g in ow.optimizer.param_groups for n in g["param_names"]}


@pytest.mark.parametrize("merge", [True, False])
def test_lr_and_weight_decay_per_parameter_equal_hand_computed(merge: bool) -> None:
    model = Net()
    ow = build_optim_wrapper(model, _cfg(merge_groups=merge))
    assert _options(ow) == EXPECTED
    names = {id(p): n for n, p in model.named_parameters()}
    assert [names[id(p)] for g in ow.optimizer.param_groups for p in g["params"]] == [
        n for g in ow.optimizer.param_groups for n in g["param_names"]
    ]
    n_groups = len(ow.optimizer.param_groups)
    if merge:
        assert n_groups == len(set(EXPECTED.values()))  # one group per distinct (lr, weight_decay)
    else:
        assert n_groups == len(EXPECTED)  # mmengine: one group per trainable parameter; the frozen one is left out


def test_custom_keys_ties_go_to_the_alphabetically_first_and_options_are_copied() -> None:
    model = nn.Module()
    model.abc = nn.Linear(2, 2)
    ow = build_optim_wrapper(
        model,
        dict(
            optimizer=dict(type="SGD", lr=LR),
            paramwise_cfg=dict(custom_keys={"bc": dict(lr_mult=3.0), "ab": dict(lr_mult=2.0, momentum=0.5)}),
        ),
    )
    (group,) = ow.optimizer.param_groups
    assert group["lr"] == LR * 2.0 and group["momentum"] == 0.5 and group["param_names"] == ["abc.weight", "abc.bias"]
    # custom keys match "prefix.name": a top-level parameter's name is ".name", a dotted key pins the start
    top = nn.Module()
    top.w = nn.Parameter(torch.ones(2))
    top.sub = nn.Module()
    top.sub.w = nn.Parameter(torch.ones(2))
    ow = build_optim_wrapper(
        top, dict(optimizer=dict(type="SGD", lr=LR), paramwise_cfg=dict(custom_keys={".w": dict(lr_mult=0.5)}))
    )
    assert {n: g["lr"] for g in ow.optimizer.param_groups for n in g["param_names"]} == {
        "w": LR * 0.5,
        "sub.w": LR * 0.5,
    }


def test_adam_default_lr_is_the_base_of_lr_multipliers() -> None:
    model = nn.Linear(2, 2)
    ow = build_optim_wrapper(model, dict(optimizer=dict(type="Adam"), paramwise_cfg=dict(bias_lr_mult=10.0)))
    assert _options_lr(ow) == {"weight": 1e-3, "bias": 1e-3 * 10.0}


def _options_lr(ow: OptimWrapper) -> dict[str, float]:
    return {n: g["lr"] for g in ow.optimizer.param_groups for n in g["param_names"]}


def test_deformable_conv_offsets_get_dcn_offset_lr_mult() -> None:
    class DeformConv2d(nn.Module):  # mmcv's class name; its offset layer is a child Conv2d named conv_offset
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(2, 2, 1, 1))
            self.bias = nn.Parameter(torch.zeros(2))
            self.conv_offset = nn.Conv2d(2, 2, 1)

    model = nn.Module()
    model.dcn = DeformConv2d()
    ow = build_optim_wrapper(
        model,
        dict(
            optimizer=dict(type="SGD", lr=LR, weight_decay=WD),
            paramwise_cfg=dict(dcn_offset_lr_mult=0.1, bias_lr_mult=2.0, bias_decay_mult=0.0),
        ),
    )
    assert _options(ow) == {
        "dcn.weight": (LR, WD),
        "dcn.bias": (LR * 2.0, WD * 0.0),  # the deformable conv's own bias is an ordinary bias
        "dcn.conv_offset.weight": (LR * 0.1, WD),
        "dcn.conv_offset.bias": (LR * 0.1, WD),  # no bias rules inside a deformable conv
    }


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(16, 3, 5, 5, generator=g), torch.randn(16, 2, generator=g))


def test_training_equals_hand_written_loop_with_the_same_param_groups(trainer_factory) -> None:
    model = Net()
    ref = copy.deepcopy(model)
    ds = _data()
    t = trainer_factory(
        model=model,
        dataset=ds,
        batch_size=4,
        train_cfg=dict(max_epochs=2),
        optim_wrapper=_cfg(),
        default_hooks=dict(checkpoint=None, logger=dict(interval=1)),
    )
    t.train()

    # mmengine's layout, by hand: one group per parameter with the options worked out above
    groups = [
        {"params": [p], "lr": EXPECTED[n][0], "weight_decay": EXPECTED[n][1]}
        for n, p in ref.named_parameters()
        if p.requires_grad
    ]
    opt = torch.optim.SGD(groups, lr=LR, weight_decay=WD, momentum=0.9)
    ref.train()
    for _ in range(2):
        for i in range(0, 16, 4):
            x, y = ds.tensors[0][i : i + 4], ds.tensors[1][i : i + 4]
            F.mse_loss(ref(x), y).backward()
            opt.step()
            opt.zero_grad()
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    for a, b in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # the log has the base lr (the optimizer's default) and the first group's lr, as mmengine logs them
    rec = json.loads((t.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["base_lr"] == LR and rec["lr"] == EXPECTED["backbone.conv.weight"][0]


@pytest.mark.parametrize(
    "opt_cfg",
    [
        dict(type="AdamW", lr=1e-2, weight_decay=0.05),
        dict(type="SGD", lr=0.1, weight_decay=0.01, momentum=0.9, nesterov=True),
    ],
)
def test_merged_groups_train_exactly_like_one_group_per_parameter(opt_cfg: dict[str, Any]) -> None:
    """The documented difference from mmengine (groups merged by equal options) changes no number."""
    ds = _data()
    models = [Net(), Net()]
    wrappers = [
        build_optim_wrapper(m, dict(optimizer=opt_cfg, paramwise_cfg={**PARAMWISE, "merge_groups": merge}))
        for m, merge in zip(models, (True, False))
    ]
    assert len(wrappers[0].optimizer.param_groups) < len(wrappers[1].optimizer.param_groups)
    for m, ow in zip(models, wrappers):
        for i in range(0, 16, 4):
            ow.update_params(m(ds.tensors[0][i : i + 4], ds.tensors[1][i : i + 4], mode="loss")["loss"])
    for a, b in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_unknown_paramwise_keys_say_the_closest() -> None:
    with pytest.raises(KeyError, match="Unknown paramwise_cfg key 'bias_lr_mul'. Did you mean 'bias_lr_mult'"):
        build_optim_wrapper(Net(), _cfg(bias_lr_mul=2.0))
    with pytest.raises(KeyError, match=r"custom_keys\['fc'\] key 'lr_mul'. Did you mean 'lr_mult'.*momentum"):
        build_optim_wrapper(
            Net(), dict(optimizer=dict(type="SGD", lr=LR), paramwise_cfg=dict(custom_keys={"fc": dict(lr_mul=0.1)}))
        )
    with pytest.raises(KeyError, match="Unknown optim_wrapper key 'paramwise'. Did you mean 'paramwise_cfg'"):
        build_optim_wrapper(Net(), dict(optimizer=dict(type="SGD", lr=LR), paramwise=dict()))


def test_misconfigurations_name_the_fix() -> None:
    with pytest.raises(ValueError, match="norm_decay_mult multiplies the optimizer's weight_decay.*add weight_decay="):
        build_optim_wrapper(Net(), dict(optimizer=dict(type="SGD", lr=LR), paramwise_cfg=dict(norm_decay_mult=0.0)))
    with pytest.raises(ValueError, match=r"custom_keys\['fc'\] has decay_mult.*add weight_decay="):
        build_optim_wrapper(
            Net(), dict(optimizer=dict(type="SGD", lr=LR), paramwise_cfg=dict(custom_keys={"fc": dict(decay_mult=0.0)}))
        )
    with pytest.raises(ValueError, match="bias_lr_mult=.* must be a number"):
        build_optim_wrapper(Net(), _cfg(bias_lr_mult="2"))
    model = Net()
    with pytest.raises(TypeError, match="paramwise_cfg builds the optimizer's param groups"):
        build_optim_wrapper(
            model, dict(optimizer=torch.optim.SGD(model.parameters(), lr=LR), paramwise_cfg=dict(bias_lr_mult=2.0))
        )


def test_shared_parameters_need_bypass_duplicate() -> None:
    model = nn.Module()
    model.enc = nn.Linear(3, 3, bias=False)
    model.dec = nn.Linear(3, 3, bias=False)
    model.dec.weight = model.enc.weight  # tied weights
    with pytest.raises(ValueError, match="'dec.weight' is the same tensor as 'enc.weight'.*bypass_duplicate=True"):
        build_optim_wrapper(
            model, dict(optimizer=dict(type="SGD", lr=LR), paramwise_cfg=dict(custom_keys={"dec": dict(lr_mult=0.5)}))
        )
    ow = build_optim_wrapper(
        model,
        dict(
            optimizer=dict(type="SGD", lr=LR),
            paramwise_cfg=dict(bypass_duplicate=True, custom_keys={"dec": dict(lr_mult=0.5)}),
        ),
    )
    assert _options_lr(ow) == {"enc.weight": LR}  # added once, with its first name's options


@OPTIM_WRAPPER_CONSTRUCTORS.register
class HeadTimesTenConstructor(DefaultOptimWrapperConstructor):
    """A custom constructor as users write them for mmengine: override add_params."""

    def add_params(self, params, module, prefix="", is_dcn_module=False):  # noqa: D102
        super().add_params(params, module, prefix, is_dcn_module)
        if not prefix:
            for g in params:
                if any(n.startswith("fc.") for n in g["param_names"]):
                    g["lr"] = self.base_lr * 10


def test_custom_registered_constructor_and_trainer_precision(trainer_factory) -> None:
    model = Net()
    cfg = dict(
        constructor="HeadTimesTenConstructor", optimizer=dict(type="SGD", lr=LR), paramwise_cfg=dict(bias_lr_mult=1.0)
    )
    ow = build_optim_wrapper(model, cfg, precision="bf16-mixed")
    lrs = _options_lr(ow)
    assert lrs["fc.weight"] == lrs["fc.bias"] == LR * 10 and lrs["backbone.conv.weight"] == LR
    assert ow.precision.dtype == torch.bfloat16  # the plain wrapper a constructor built adopts the Trainer's precision
    with pytest.raises(
        KeyError, match="Unknown optim wrapper constructor type 'HeadTimesTen'. Did you mean 'HeadTimesTenConstructor'"
    ):
        build_optim_wrapper(model, {**cfg, "constructor": "HeadTimesTen"})
    t = trainer_factory(model=Net(), dataset=_data(), batch_size=8, optim_wrapper=cfg)
    t.train()
    assert max(g["lr"] for g in t.optim_wrapper.optimizer.param_groups) == LR * 10


def test_base_lr_follows_the_scheduler_and_is_checkpointed(trainer_factory) -> None:
    t = trainer_factory(
        model=Net(),
        dataset=_data(),
        batch_size=4,
        train_cfg=dict(max_epochs=3),
        optim_wrapper=_cfg(),
        param_scheduler=dict(type="MultiStepLR", milestones=[1, 2], gamma=0.5),
        default_hooks=dict(checkpoint=None, logger=dict(interval=4)),
    )
    t.train()
    recs = [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert [r["base_lr"] for r in recs] == [LR, LR * 0.5, LR * 0.25]
    assert [r["lr"] for r in recs] == [LR, LR * 0.5, LR * 0.25]
    ow = t.optim_wrapper
    assert ow.get_lr()["base_lr"] == [LR * 0.25]
    assert ow.get_lr()["lr"] == [g["lr"] for g in ow.optimizer.param_groups]
    fresh = build_optim_wrapper(Net(), _cfg())
    fresh.load_state_dict(ow.state_dict())
    assert fresh.get_lr() == ow.get_lr()
    assert fresh.param_groups[-1]["initial_lr"] == LR


def test_one_param_group_reports_lr_only() -> None:
    ow = build_optim_wrapper(nn.Linear(2, 2), dict(optimizer=dict(type="SGD", lr=LR)))
    assert ow.get_lr() == {"lr": [LR]} and ow.base_param_settings is None
    assert ow.param_groups is ow.optimizer.param_groups


@OPTIM_WRAPPER_CONSTRUCTORS.register
class LayerDecayConstructor(DefaultOptimWrapperConstructor):
    """mmpretrain's LearningRateDecayOptimWrapperConstructor, reduced: lr * decay_rate ** (num_layers - layer) for
    ``layers.<i>``, as ported (keys undeclared)."""

    def add_params(self, params, module, prefix="", is_dcn_module=False):  # noqa: D102
        num_layers, decay_rate = self.paramwise_cfg["num_layers"], self.paramwise_cfg["decay_rate"]
        assert self.paramwise_cfg.get("decay_type", "layer_wise") == "layer_wise"
        for name, p in module.named_parameters():
            layer = int(name.split(".")[1]) + 1 if name.startswith("layers.") else num_layers + 1
            params.append(
                {"params": [p], "param_names": [name], "lr": self.base_lr * decay_rate ** (num_layers + 1 - layer)}
            )


@OPTIM_WRAPPER_CONSTRUCTORS.register
class DeclaredLayerDecayConstructor(LayerDecayConstructor):
    """The same with its keys declared: a misspelt one is refused."""

    paramwise_keys = frozenset({"num_layers", "decay_rate", "decay_type"})


def test_a_subclass_constructors_own_paramwise_keys_are_accepted() -> None:
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])
    model.head = nn.Linear(2, 1)
    keys = dict(num_layers=2, decay_rate=0.5, decay_type="layer_wise")
    for constructor in ("LayerDecayConstructor", "DeclaredLayerDecayConstructor"):
        ow = build_optim_wrapper(
            model, dict(constructor=constructor, optimizer=dict(type="SGD", lr=LR), paramwise_cfg=keys)
        )
        assert _options_lr(ow) == {
            "layers.0.weight": LR * 0.25,
            "layers.0.bias": LR * 0.25,
            "layers.1.weight": LR * 0.5,
            "layers.1.bias": LR * 0.5,
            "head.weight": LR,
            "head.bias": LR,
        }
    with pytest.raises(KeyError, match=r"decay_rat.*Did you mean 'decay_rate'"):
        build_optim_wrapper(
            model,
            dict(
                constructor="DeclaredLayerDecayConstructor",
                optimizer=dict(type="SGD", lr=LR),
                paramwise_cfg={**keys, "decay_rat": 1},
            ),
        )
    with pytest.raises(
        KeyError, match=r"Unknown paramwise_cfg key .*declares them: paramwise_keys"
    ):  # the base constructor reads no such key
        build_optim_wrapper(model, dict(optimizer=dict(type="SGD", lr=LR), paramwise_cfg=keys))
