"""BaseModel contract: parse_losses, forward dispatch by batch type, steps, preprocessors, plain-module adapter."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import LinearReg, regression_set
from torch import nn

import trainwright as tw
from trainwright.model import BaseDataPreprocessor, BaseModel, ModuleAdapter, NormalizingDataPreprocessor, as_base_model
from trainwright.optim import OptimWrapper


def test_parse_losses_sums_keys_containing_loss():
    model = LinearReg()
    a = torch.tensor(1.5, requires_grad=True)
    losses = {
        "loss_cls": a * 2,
        "loss_box": [torch.tensor([1.0, 3.0]), torch.tensor(4.0)],
        "acc": torch.tensor([0.5, 1.0]),
    }
    total, log = model.parse_losses(losses)
    assert total.item() == 3.0 + (2.0 + 4.0)
    assert total.requires_grad
    assert set(log) == {"loss", "loss_cls", "loss_box", "acc"}
    assert log["loss"].item() == total.item() and log["acc"].item() == 0.75 and log["loss_box"].item() == 6.0
    assert all(not v.requires_grad for v in log.values())


def test_parse_losses_single_tensor_and_errors():
    model = LinearReg()
    total, log = model.parse_losses(torch.tensor(2.0))
    assert total.item() == 2.0 and list(log) == ["loss"]
    with pytest.raises(ValueError, match="no loss"):
        model.parse_losses({"acc": torch.tensor(1.0)})
    with pytest.raises(TypeError, match="must return a dict of loss tensors"):
        model.parse_losses([torch.tensor(1.0)])


class Recorder(tw.BaseModel):
    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, *inputs, mode="tensor", **kw):
        self.calls.append((len(inputs), sorted(kw), mode))
        return inputs[0] if inputs else kw["x"]


def test_forward_dispatch_by_batch_type():
    m = Recorder()
    x = torch.ones(2)
    m.val_step((x, x))
    m.val_step({"x": x, "y": x})
    m.test_step(x)
    assert m.calls == [(2, [], "predict"), (0, ["x", "y"], "predict"), (1, [], "predict")]


def test_train_step_equals_hand_step():
    model = LinearReg()
    ref = copy.deepcopy(model)
    x, y = regression_set(8).tensors
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    log = model.train_step((x, y), ow)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss = F.mse_loss(ref.linear(x), y)
    loss.backward()
    opt.step()
    assert log["loss"].item() == pytest.approx(loss.item())
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_val_step_returns_predictions():
    model = LinearReg()
    x, y = regression_set(8).tensors
    torch.testing.assert_close(model.val_step((x, y)), model.linear(x))


def test_normalizing_preprocessor_matches_hand_formula():
    pre = NormalizingDataPreprocessor(mean=[1.0, 2.0, 3.0], std=[2.0, 4.0, 8.0])
    x = torch.randn(2, 3, 4, 4)
    out, y = pre((x, torch.tensor([0, 1])), True)
    torch.testing.assert_close(
        out, (x - torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1)) / torch.tensor([2.0, 4.0, 8.0]).view(1, 3, 1, 1)
    )
    assert y.tolist() == [0, 1]
    d = pre({"inputs": x, "meta": "a"})
    torch.testing.assert_close(d["inputs"], out)
    assert d["meta"] == "a"


def test_as_base_model_keeps_base_models_and_wraps_plain_modules():
    base = LinearReg()
    assert as_base_model(base) is base
    plain = nn.Linear(2, 1)
    wrapped = as_base_model(plain)
    assert isinstance(wrapped, ModuleAdapter) and wrapped.module is plain
    assert set(wrapped.state_dict()) == {"weight", "bias"}
    sd = {k: torch.zeros_like(v) for k, v in plain.state_dict().items()}
    wrapped.load_state_dict(sd)
    assert torch.equal(plain.weight, torch.zeros(1, 2))
    with pytest.raises(TypeError, match="must be an nn.Module"):
        as_base_model(object())


def test_module_adapter_passes_mode_when_accepted():
    class WithMode(nn.Module):
        def forward(self, x, mode="tensor"):
            return {"loss": x.sum()} if mode == "loss" else x * 2

    a = ModuleAdapter(WithMode())
    assert a(torch.ones(2), mode="loss")["loss"].item() == 2.0
    assert a.val_step(torch.ones(2)).tolist() == [2.0, 2.0]


def test_train_step_goes_through_module_call() -> None:
    """Hooks on the model and global module hooks fire at every training step (the forward is always
    nn.Module.__call__)."""
    from conftest import LinearReg

    from trainwright.optim import OptimWrapper

    model = LinearReg()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    batch = (torch.randn(4, 4), torch.randn(4, 1))

    seen: list[str] = []
    handle = model.register_forward_pre_hook(lambda m, args: seen.append("own"))
    model.train_step(batch, ow)
    handle.remove()

    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: seen.append(type(m).__name__))
    try:
        model.train_step(batch, ow)
    finally:
        handle.remove()
    assert seen[0] == "own" and "LinearReg" in seen[1:]


def test_train_step_calls_an_overridden_parse_losses() -> None:
    """train_step inlines parse_losses' single-loss fast path, but never past a subclass's own parse_losses."""
    from conftest import LinearReg

    from trainwright.optim import OptimWrapper

    class Scaled(LinearReg):
        def parse_losses(self, losses):
            loss, log_vars = super().parse_losses(losses)
            return loss * 2, {**log_vars, "doubled": (loss * 2).detach()}

    plain, scaled = LinearReg(), Scaled()
    scaled.load_state_dict(plain.state_dict())
    batch = (torch.randn(4, 4), torch.randn(4, 1))
    out = scaled.train_step(batch, OptimWrapper(torch.optim.SGD(scaled.parameters(), lr=0.1)))
    ref = plain.train_step(batch, OptimWrapper(torch.optim.SGD(plain.parameters(), lr=0.2)))  # 2x loss == 2x lr for SGD
    assert set(out) == {"loss", "doubled"} and torch.equal(out["doubled"], 2 * out["loss"])
    assert torch.equal(out["loss"], ref["loss"])
    for p, q in zip(scaled.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)


def test_train_step_calls_a_parse_losses_patched_onto_the_class_later(monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import LinearReg

    from trainwright.optim import OptimWrapper

    class Patched(LinearReg):
        pass

    seen: list[str] = []

    def parse(self, losses):
        seen.append("patched")
        return losses["loss"], {"loss": losses["loss"].detach()}

    monkeypatch.setattr(Patched, "parse_losses", parse, raising=False)
    model = Patched()
    model.train_step((torch.randn(4, 4), torch.randn(4, 1)), OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1)))
    assert seen == ["patched"]


class _MMPre(BaseDataPreprocessor):
    """An mmengine-style preprocessor: its forward starts with ``self.cast_data``."""

    def forward(self, data, training=False):
        data = self.cast_data(data)
        return {"inputs": data["inputs"] * 2, "seen_autocast": torch.is_autocast_enabled("cpu")}


class _MMNet(BaseModel):
    def __init__(self, init_cfg=None):
        super().__init__(data_preprocessor=_MMPre(), init_cfg=init_cfg)
        self.fc = nn.Linear(2, 1)
        self.inner = nn.Sequential(BaseDataPreprocessor())

    def forward(self, inputs, seen_autocast=False, mode="tensor"):
        self.seen_autocast = seen_autocast
        return {"loss": self.fc(inputs).float().pow(2).mean()}


def test_mmengine_style_model_constructs_and_its_preprocessor_runs_under_the_optim_context() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no init_cfg: no warning
        model = _MMNet()
    assert model.init_cfg is None
    with pytest.warns(
        UserWarning, match=r"_MMNet\(init_cfg=\{'type': 'Kaiming'\}\) is kept as \.init_cfg but not applied.*load_from"
    ):
        assert _MMNet(init_cfg=dict(type="Kaiming")).init_cfg == {"type": "Kaiming"}
    ow = tw.AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype="bfloat16")
    model.train_step({"inputs": torch.randn(4, 2)}, ow)
    assert model.seen_autocast is True  # as mmengine: the preprocessor runs inside optim_context (autocast)


def test_every_preprocessor_follows_the_models_device() -> None:
    model = _MMNet()
    pres = [m for m in model.modules() if isinstance(m, BaseDataPreprocessor)]
    assert len(pres) == 2
    model.to("meta")
    assert [p.device.type for p in pres] == ["meta", "meta"]  # the nested one too
    model.to_empty(device="cpu").cpu()
    assert [p.device.type for p in pres] == ["cpu", "cpu"]
    alone = BaseDataPreprocessor().to("meta")
    assert alone.device == torch.device("meta")
    assert alone.cpu().device == torch.device("cpu")


def test_a_data_preprocessor_that_is_no_module_is_a_type_error_at_construction() -> None:
    with pytest.raises(TypeError, match=r"BaseModel\(data_preprocessor=...\) must be an nn.Module .* got str"):
        BaseModel(data_preprocessor="BaseDataPreprocessor")
    with pytest.raises(TypeError, match=r"got function"):
        BaseModel(data_preprocessor=dict(type=lambda: lambda data, training: data))  # the dict builds no module
    assert isinstance(
        BaseModel(data_preprocessor=dict(type="BaseDataPreprocessor")).data_preprocessor, BaseDataPreprocessor
    )
