"""Behaviour of the mmcv-compatible fp16 utilities, on CPU, against torch's own computations."""

from __future__ import annotations

import copy
import inspect
import pickle
from collections import OrderedDict, defaultdict, namedtuple
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from trainwright.amp import (
    auto_fp16,
    cast_tensor_type,
    force_fp32,
    patch_forward_method,
    patch_norm_fp32,
    wrap_fp16_model,
)

LOW = [torch.float16, torch.bfloat16]
Pair = namedtuple("Pair", ["a", "b"])


# ----------------------------------------------------------------------------- cast_tensor_type


def test_cast_only_tensors_of_src_dtype() -> None:
    f32, f64, i64 = torch.randn(3), torch.randn(3, dtype=torch.float64), torch.arange(3)
    out = cast_tensor_type([f32, f64, i64], torch.float32, torch.float16)
    assert out[0].dtype == torch.float16
    assert torch.equal(out[0], f32.to(torch.float16))
    assert out[1] is f64  # float64 is not the src dtype
    assert out[2] is i64  # integer tensors are never touched


def test_cast_preserves_container_types_recursively() -> None:
    t = torch.ones(2)
    dd: defaultdict[str, Any] = defaultdict(list, {"x": t})
    inputs = {
        "dict": {"x": t},
        "ordered": OrderedDict([("z", t), ("a", t), ("m", t)]),
        "default": dd,
        "list": [t, [t, (t,)]],
        "tuple": (t, t),
        "named": Pair(a=t, b=[t]),
    }
    out = cast_tensor_type(inputs, torch.float32, torch.bfloat16)
    assert type(out) is dict
    assert type(out["ordered"]) is OrderedDict and list(out["ordered"]) == ["z", "a", "m"]
    assert type(out["default"]) is defaultdict and out["default"].default_factory is list
    assert type(out["list"]) is list and type(out["list"][1]) is list and type(out["list"][1][1]) is tuple
    assert type(out["tuple"]) is tuple
    assert type(out["named"]) is Pair and out["named"]._fields == ("a", "b")
    leaves = [
        out["dict"]["x"], *out["ordered"].values(), out["default"]["x"], out["list"][0],
        out["list"][1][0], out["list"][1][1][0], *out["tuple"], out["named"].a, out["named"].b[0],
    ]  # fmt: skip
    assert all(leaf.dtype == torch.bfloat16 for leaf in leaves)
    assert t.dtype == torch.float32  # the input was not modified in place


def test_cast_leaves_modules_strings_arrays_and_objects_untouched() -> None:
    module, text, array, obj = nn.Linear(2, 2), "img", np.ones(3, dtype=np.float32), object()
    out = cast_tensor_type([module, text, array, obj, None, 1.5], torch.float32, torch.float16)
    assert out[0] is module and module.weight.dtype == torch.float32
    assert out[1] is text and out[2] is array and out[3] is obj and out[4] is None and out[5] == 1.5
    assert array.dtype == np.float32


def test_cast_returns_container_itself_when_nothing_matches() -> None:
    batch = {"labels": [torch.arange(3)], "name": "a"}
    assert cast_tensor_type(batch, torch.float32, torch.float16) is batch


def test_cast_src_none_means_every_floating_tensor() -> None:
    out = cast_tensor_type((torch.randn(2), torch.randn(2, dtype=torch.float64), torch.arange(2)), None, torch.float16)
    assert [t.dtype for t in out] == [torch.float16, torch.float16, torch.int64]


def test_cast_to_device_moves_tensors_like_mmcv_1_7() -> None:
    meta = torch.device("meta")
    out = cast_tensor_type({"x": torch.randn(2), "i": torch.arange(2)}, None, meta)
    assert out["x"].device == meta and out["i"].device == meta  # every tensor, ints included
    moved = cast_tensor_type([torch.randn(2)], torch.device("cpu"), meta)
    assert moved[0].device == meta and moved[0].dtype == torch.float32
    stay = [torch.randn(2)]
    assert cast_tensor_type(stay, torch.device("cuda"), meta) is stay  # src device filters


def test_cast_rejects_bad_types_with_a_fix() -> None:
    with pytest.raises(TypeError, match="torch.dtype or a torch.device"):
        cast_tensor_type(torch.randn(2), torch.float32, "float16")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pass src_type as a torch.dtype"):
        cast_tensor_type(torch.randn(2), torch.device("cpu"), torch.float16)
    with pytest.raises(TypeError, match="torch.dtype or a torch.device"):
        cast_tensor_type({"x": [torch.randn(2)]}, str, str)  # type: ignore[arg-type]


def test_cast_with_nothing_to_cast_ignores_the_types() -> None:
    # mmcv 1.x (and its tests): the types are only used on tensors
    assert cast_tensor_type("tensor", str, str) == "tensor"  # type: ignore[arg-type]
    batch = {"name": "a", "ids": [1, 2]}
    assert cast_tensor_type(batch, str, str) is batch  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- patch_forward_method


def test_patch_forward_method_casts_inputs_and_outputs() -> None:
    seen: list[torch.dtype] = []

    def f(x: torch.Tensor, idx: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        """Doc of f."""
        seen.extend([x.dtype, idx.dtype, scale.dtype])
        return x * scale

    x, scale = torch.randn(4).half(), torch.randn(4).half()
    patched = patch_forward_method(f, torch.float16, torch.float32)
    out = patched(x, torch.arange(4), scale=scale)
    assert seen == [torch.float32, torch.int64, torch.float32]
    assert out.dtype == torch.float16
    assert torch.equal(out, (x.float() * scale.float()).half())
    assert patched.__name__ == "f" and patched.__doc__ == "Doc of f."

    kept = patch_forward_method(f, torch.float16, torch.float32, convert_output=False)
    assert kept(x, torch.arange(4), scale=scale).dtype == torch.float32


# ----------------------------------------------------------------------------- auto_fp16


class Recorder(nn.Module):
    """A head whose forward records what it receives and what autocast state it runs in."""

    def __init__(self, enabled: bool | None, out_fp32: bool = False, dtype: torch.dtype = torch.float16) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        if enabled is not None:
            self.fp16_enabled = enabled
        self.seen: dict[str, Any] = {}

        @auto_fp16(apply_to=("x", "extra"), out_fp32=out_fp32, dtype=dtype)
        def forward(self: Recorder, x: torch.Tensor, y: torch.Tensor, extra: Any = None) -> torch.Tensor:
            self.seen = {
                "x": x, "y": y, "extra": extra,
                "autocast": torch.is_autocast_enabled("cpu"), "autocast_dtype": torch.get_autocast_dtype("cpu"),
            }  # fmt: skip
            return self.fc(x)

        self._forward = forward

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._forward(self, *args, **kwargs)


@pytest.mark.parametrize("enabled", [False, None])
def test_auto_fp16_is_a_plain_call_when_disabled_or_absent(enabled: bool | None) -> None:
    head = Recorder(enabled)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    out = head(x, y, extra=[x])
    assert head.seen["x"] is x and head.seen["y"] is y and head.seen["extra"][0] is x
    assert head.seen["autocast"] is False
    assert out.dtype == torch.float32 and torch.equal(out, head.fc(x))


@pytest.mark.parametrize("dtype", LOW)
def test_auto_fp16_casts_named_args_and_runs_under_autocast(dtype: torch.dtype) -> None:
    head = Recorder(True, dtype=dtype)
    x, y, idx = torch.randn(2, 4), torch.randn(2, 4), torch.arange(2)
    out = head(x, y, [x, idx])  # extra given positionally
    assert head.seen["x"].dtype == dtype and torch.equal(head.seen["x"], x.to(dtype))
    assert head.seen["y"] is y  # not in apply_to
    assert head.seen["extra"][0].dtype == dtype and head.seen["extra"][1] is idx
    assert head.seen["autocast"] is True and head.seen["autocast_dtype"] == dtype
    with torch.autocast("cpu", dtype=dtype):  # reference: torch's own autocast on the cast input
        expected = head.fc(x.to(dtype))
    assert out.dtype == dtype and torch.equal(out, expected)


def test_auto_fp16_casts_keyword_arguments() -> None:
    head = Recorder(True)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    head(x=x, y=y, extra={"k": x})
    assert head.seen["x"].dtype == torch.float16
    assert head.seen["y"] is y
    assert head.seen["extra"]["k"].dtype == torch.float16


def test_auto_fp16_out_fp32_returns_float32() -> None:
    head = Recorder(True, out_fp32=True)
    x = torch.randn(2, 4)
    out = head(x, x)
    with torch.autocast("cpu", dtype=torch.float16):
        expected = head.fc(x.half()).float()
    assert out.dtype == torch.float32 and torch.equal(out, expected)


class AllArgs(nn.Module):
    fp16_enabled = True

    @auto_fp16(dtype=torch.bfloat16)
    def forward(self, a: torch.Tensor, *rest: torch.Tensor, scale: torch.Tensor, **extra: Any) -> list[Any]:
        """Collects the dtypes it was called with."""
        return [a, *rest, scale, extra]


def test_auto_fp16_apply_to_none_casts_every_float32_argument() -> None:
    f32, i64, f64 = torch.randn(2), torch.arange(2), torch.randn(2, dtype=torch.float64)
    a, r1, r2, scale, extra = AllArgs()(f32, f32, i64, scale=f32, meta={"w": f32, "d": f64})
    assert [a.dtype, r1.dtype, scale.dtype, extra["meta"]["w"].dtype] == [torch.bfloat16] * 4
    assert r2 is i64 and extra["meta"]["d"] is f64  # only float32 tensors are cast


def test_auto_fp16_keeps_metadata() -> None:
    assert AllArgs.forward.__name__ == "forward"
    assert AllArgs.forward.__doc__ == "Collects the dtypes it was called with."
    assert AllArgs.forward.__wrapped__.__name__ == "forward"  # type: ignore[attr-defined]
    params = inspect.signature(AllArgs.forward).parameters
    assert list(params) == ["self", "a", "rest", "scale", "extra"]
    assert params["rest"].kind is inspect.Parameter.VAR_POSITIONAL


def test_auto_fp16_selects_varargs_and_kwargs_by_their_parameter_name() -> None:
    class M(nn.Module):
        fp16_enabled = True

        @auto_fp16(apply_to=("rest", "extra"))
        def forward(self, a: torch.Tensor, *rest: torch.Tensor, **extra: torch.Tensor) -> tuple[Any, ...]:
            return (a, rest, extra)

    t = torch.randn(2)
    a, rest, extra = M()(t, t, t, k=t)
    assert a is t and rest[0].dtype == rest[1].dtype == extra["k"].dtype == torch.float16


def test_auto_fp16_rejects_unsupported_self() -> None:
    class NotAModule:
        fp16_enabled = True

        @auto_fp16()
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(TypeError, match="@auto_fp16 can only be used to decorate the method of those classes"):
        NotAModule().forward(torch.randn(2))

    class Allowed(NotAModule):
        @auto_fp16(supported_types=(NotAModule,))
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    assert Allowed().forward(torch.randn(2)).dtype == torch.float16


def test_auto_fp16_rejects_unknown_apply_to_name_at_decoration() -> None:
    with pytest.raises(ValueError, match=r"names \['img'\], which are not arguments"):

        @auto_fp16(apply_to=("img",))
        def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(ValueError, match="float16 or torch.bfloat16"):
        auto_fp16(dtype=torch.float64)


# ----------------------------------------------------------------------------- force_fp32


class LossHead(nn.Module):
    def __init__(self, out_fp16: bool = False, dtype: torch.dtype = torch.float16) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.fp16_enabled = True
        self.seen: dict[str, Any] = {}

        @force_fp32(apply_to=("x",), out_fp16=out_fp16, dtype=dtype)
        def loss(self: LossHead, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            self.seen = {"x": x, "w": w, "autocast": torch.is_autocast_enabled("cpu")}
            return self.fc(x)

        self._loss = loss

    def loss(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._loss(self, *args, **kwargs)


@pytest.mark.parametrize("dtype", LOW)
def test_force_fp32_computes_in_float32_inside_autocast(dtype: torch.dtype) -> None:
    head = LossHead(dtype=dtype)
    x, w = torch.randn(2, 4).to(dtype), torch.randn(2).to(dtype)
    with torch.autocast("cpu", dtype=dtype):
        outside = head.fc(x)
        inside = head.loss(x, w)
        still_on = torch.is_autocast_enabled("cpu")
    assert outside.dtype == dtype  # autocast is really active around the call
    assert head.seen["x"].dtype == torch.float32 and head.seen["w"] is w
    assert head.seen["autocast"] is False and still_on is True  # disabled only inside
    assert inside.dtype == torch.float32 and torch.equal(inside, head.fc(x.float()))


def test_force_fp32_out_fp16() -> None:
    head = LossHead(out_fp16=True, dtype=torch.bfloat16)
    x = torch.randn(2, 4).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head.loss(x, x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, head.fc(x.float()).bfloat16())


def test_force_fp32_is_a_plain_call_when_disabled() -> None:
    head = LossHead()
    head.fp16_enabled = False
    x = torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head.loss(x, x)
    assert head.seen["x"] is x and head.seen["autocast"] is True
    assert out.dtype == torch.bfloat16  # autocast was left on


def test_force_fp32_rejects_non_module_self() -> None:
    class Plain:
        @force_fp32()
        def loss(self, x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(TypeError, match="@force_fp32 can only be used to decorate the method of nn.Module"):
        Plain().loss(torch.randn(2))


# ----------------------------------------------------------------------------- together


class Detector(nn.Module):
    """mmdet-style: an auto_fp16 forward that hands its features to a force_fp32 loss."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)
        self.fp16_enabled = False

    @auto_fp16(apply_to=("img",))
    def forward(self, img: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = self.backbone(img)
        return feats, self.loss(feats, target)

    @force_fp32(apply_to=("feats",))
    def loss(self, feats: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.head(feats), target)


def test_wrapped_model_runs_backbone_in_half_and_loss_in_float32() -> None:
    torch.manual_seed(0)
    model = Detector()
    img, target = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    feats, loss = model(img, target)
    assert feats.dtype == loss.dtype == torch.float32

    assert wrap_fp16_model(model) is model and model.fp16_enabled is True
    feats, loss = model(img, target)
    with torch.autocast("cpu", dtype=torch.float16):
        ref_feats = model.backbone(img.half())
    ref_loss = nn.functional.cross_entropy(model.head(ref_feats.float()), target)
    assert feats.dtype == torch.float16 and torch.equal(feats, ref_feats)
    assert loss.dtype == torch.float32 and torch.equal(loss, ref_loss)
    loss.backward()
    assert model.backbone.weight.grad is not None and model.backbone.weight.grad.dtype == torch.float32


# ----------------------------------------------------------------------------- wrap_fp16_model


def test_wrap_fp16_model_sets_flags_only_where_present_and_keeps_weights() -> None:
    inner, outer = Recorder(False), Detector()
    model = nn.Sequential(outer, nn.Sequential(inner, nn.ReLU()), nn.Linear(2, 2))
    wrap_fp16_model(model, dtype=torch.bfloat16)
    assert outer.fp16_enabled is True and inner.fp16_enabled is True
    assert not hasattr(model, "fp16_enabled") and not hasattr(model[2], "fp16_enabled")
    assert all(p.dtype == torch.float32 for p in model.parameters())  # no half conversion
    with pytest.raises(ValueError, match="float16 or torch.bfloat16"):
        wrap_fp16_model(model, dtype=torch.float32)


# ----------------------------------------------------------------------------- patch_norm_fp32


def _norm_model() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(8, 8, 1), nn.BatchNorm1d(8), nn.Sequential(nn.GroupNorm(2, 8)))
    with torch.no_grad():
        model[2][0].weight.uniform_(0.5, 2)
        model[2][0].bias.uniform_(-1, 1)
    return model


def test_patch_norm_fp32_keeps_norms_float32_after_half() -> None:
    model = patch_norm_fp32(_norm_model().half())
    assert model[0].weight.dtype == torch.float16
    bn, gn = model[1], model[2][0]
    for tensor in (bn.weight, bn.bias, bn.running_mean, bn.running_var, gn.weight, gn.bias):
        assert tensor.dtype == torch.float32
    assert bn.num_batches_tracked.dtype == torch.int64
    out = model(torch.randn(3, 8, 16).half())  # the whole model runs end to end
    assert out.dtype == torch.float16


def test_patched_group_norm_computes_in_float32() -> None:
    unpatched_half = _norm_model()[2][0].half()
    gn = patch_norm_fp32(copy.deepcopy(unpatched_half))
    reference = copy.deepcopy(unpatched_half).float()  # same (half-rounded) weights, in float32
    x = (torch.randn(4, 8, 64) * 3 + 100).half()  # large mean: half arithmetic loses precision
    out = gn(x)
    expected = reference(x.float()).half()
    assert out.dtype == torch.float16 and torch.equal(out, expected)
    assert not torch.equal(unpatched_half(x), expected)  # the test can tell the difference


def test_patch_norm_fp32_bfloat16_option() -> None:
    low = _norm_model()[2][0].bfloat16()
    gn = patch_norm_fp32(copy.deepcopy(low), dtype=torch.bfloat16)
    reference = low.float()
    x = torch.randn(2, 8, 4).bfloat16()
    assert torch.equal(gn(x), reference(x.float()).bfloat16())


def test_patch_norm_fp32_is_idempotent_and_deepcopy_safe() -> None:
    once = patch_norm_fp32(_norm_model().half())
    model = patch_norm_fp32(patch_norm_fp32(_norm_model().half()))
    gn = model[2][0]
    x = torch.randn(2, 8, 4).half()
    assert torch.equal(gn(x), once[2][0](x))  # patching twice computes what patching once does
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone[2][0].weight.mul_(2)
    reference = nn.GroupNorm(2, 8)  # a plain float32 layer with the copy's own (doubled) weights
    reference.load_state_dict(clone[2][0].state_dict())
    reference_out = reference(x.float()).half()
    out = clone[2][0](x)
    assert out.dtype == torch.float16 and torch.equal(out, reference_out)  # the copy is patched, with its own weights
    assert not torch.equal(out, gn(x))
    restored = pickle.loads(pickle.dumps(model))  # the patched model stays picklable (torch.save of a whole model)
    assert torch.equal(restored[2][0](x), gn(x))
