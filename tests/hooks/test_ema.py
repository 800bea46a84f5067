"""EMAHook driven the way a run drives it: averaging, evaluation with the average, resume."""

from __future__ import annotations

import io
import logging
import math
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainwright.evaluation.evaluator import Evaluator
from trainwright.evaluation.metric import Metric
from trainwright.hooks.dispatch import HookList
from trainwright.hooks.ema import EMAHook
from trainwright.hooks.hook import Hook
from trainwright.loops.context import LoopContext
from trainwright.loops.eval_loop import EvalLoop
from trainwright.model.base_model import BaseModel
from trainwright.registry import HOOKS
from trainwright.utils.progress import Progress


class Regressor(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor, mode: str = "tensor"):
        out = self.net(x)
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


class MSE(Metric):
    batched_results = True

    def process(self, data_batch, outputs) -> None:
        self.results.append(((outputs - data_batch[1]) ** 2).mean(1))

    def compute(self, results) -> dict[str, float]:
        return {"mse": float(torch.cat(results).mean())}


def _data(seed: int, n: int = 24) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1)


def _trainer(*hooks: Hook, seed: int = 0) -> types.SimpleNamespace:
    torch.manual_seed(seed)
    model = Regressor()
    t = types.SimpleNamespace(
        model=model,
        unwrapped_model=model,
        progress=Progress(),
        logger=logging.getLogger("t"),
        should_stop=False,
        bind_step=lambda: None,
    )
    t.hooks = HookList(hooks)
    t.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    t.train_loader = DataLoader(_data(1), batch_size=4)
    t.train_loop = types.SimpleNamespace(by_epoch=True, dataloader=t.train_loader, max_iters=600, max_epochs=100)
    t.val_loop = EvalLoop(DataLoader(_data(2), batch_size=5), Evaluator(MSE()), mode="val")
    t.test_loop = EvalLoop(DataLoader(_data(3), batch_size=5), Evaluator(MSE()), mode="test")
    t.ctx = LoopContext(view=t, model=model, hooks=t.hooks, progress=t.progress, logger=t.logger)
    return t


def _train(t: types.SimpleNamespace, iters: int) -> None:
    """What the train loop does around ``after_train_iter`` (epoch boundaries included)."""
    batches = list(t.train_loader)
    for _ in range(iters):
        idx = t.progress.iter_in_epoch
        x, y = batches[idx]
        t.model.train()
        t.optimizer.zero_grad()
        loss = t.model(x, y, mode="loss")["loss"]
        loss.backward()
        t.optimizer.step()
        t.progress.iteration += 1
        t.progress.iter_in_epoch += 1
        for fn in t.hooks.calls["after_train_iter"]:
            fn(t, idx, (x, y), {"loss": loss.detach()})
        if t.progress.iter_in_epoch == len(batches):
            t.progress.epoch += 1
            t.progress.iter_in_epoch = 0


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class _ReferenceEMA:
    """Textbook EMA: copy at the first update, then ``(1 - m) * avg + m * w``."""

    def __init__(self, momentum: float) -> None:
        self.m = momentum
        self.avg: dict[str, torch.Tensor] | None = None

    def update(self, model: nn.Module) -> None:
        w = _weights(model)
        self.avg = w if self.avg is None else {k: (1 - self.m) * self.avg[k] + self.m * w[k] for k in w}


def _train_beside_reference(
    t: types.SimpleNamespace, hook: EMAHook, momentum: float, iters: int = 5
) -> tuple[_ReferenceEMA, dict[str, torch.Tensor]]:
    """Train ``iters`` steps with ``hook`` and a hand-written EMA beside it; return it and the training weights."""
    hook.before_train(t)
    ref = _ReferenceEMA(momentum)
    for _ in range(iters):
        _train(t, 1)
        ref.update(t.model)
    return ref, _weights(t.model)


def _mse_with(weights: dict[str, torch.Tensor], loop: EvalLoop) -> float:
    model = Regressor()
    model.load_state_dict(weights)
    with torch.no_grad():
        errs = [((model(x, y, mode="predict") - y) ** 2).mean(1) for x, y in loop.dataloader]
    return float(torch.cat(errs).mean())


@pytest.mark.parametrize("begin_iter", [0, 3])
def test_average_matches_reference_from_begin_iter(begin_iter: int) -> None:
    hook = EMAHook(momentum=0.2, begin_iter=begin_iter)
    t = _trainer(hook)
    hook.before_train(t)
    ref = _ReferenceEMA(0.2)
    batches = list(t.train_loader)
    for it in range(1, 10):  # crosses an epoch boundary (6 batches per epoch)
        _train(t, 1)
        if it >= begin_iter:  # mmengine: from the iteration where runner.iter + 1 >= begin_iter
            ref.update(t.model)
    assert len(batches) == 6 and t.progress.epoch == 1
    assert hook.ema.steps == 9 - max(begin_iter, 1) + 1
    for k, v in ref.avg.items():
        torch.testing.assert_close(hook.ema.averaged[k], v, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("ema_type", "gamma"), [("MomentumAnnealingEMA", 3.0), ("ExpMomentumEMA", 4.0)])
def test_annealed_ema_types_match_mmengine_and_mmdet_formulas(ema_type: str, gamma: float) -> None:
    """mmengine's MomentumAnnealingEMA / mmdet's ExpMomentumEMA (RTMDet's ``ema_type``): the momentum of update n,
    written out."""
    momentum = 0.01

    def m(steps: int) -> float:  # their avg_func, with steps the updates made before (>= 1: the first update copies)
        if ema_type == "MomentumAnnealingEMA":
            return max(momentum, gamma / (gamma + steps))
        return (1 - momentum) * math.exp(-float(1 + steps) / gamma) + momentum

    hook = EMAHook(momentum=momentum, ema_type=ema_type, gamma=gamma)
    t = _trainer(hook)
    hook.before_train(t)
    avg: dict[str, torch.Tensor] | None = None
    for steps in range(8):
        _train(t, 1)
        w = _weights(t.model)
        avg = w if avg is None else {k: (1 - m(steps)) * avg[k] + m(steps) * w[k] for k in w}
    assert avg is not None
    for k, v in avg.items():
        torch.testing.assert_close(hook.ema.averaged[k], v, atol=1e-6, rtol=0)
    assert m(1) > 0.2  # the early updates weigh far more than momentum: the test would see a constant momentum


def test_ema_types_without_an_equivalent_are_refused() -> None:
    with pytest.raises(ValueError, match="ema_type 'StochasticWeightAverage' is not supported .use SWAHook"):
        EMAHook(ema_type="StochasticWeightAverage")
    with pytest.raises(ValueError, match="gamma=5 needs an annealed ema_type"):
        EMAHook(gamma=5)


def test_begin_epoch_delays_averaging() -> None:
    hook = EMAHook(momentum=0.2, begin_epoch=2)  # 1-based: the first iteration of the second epoch
    t = _trainer(hook)
    hook.before_train(t)
    _train(t, 6)
    assert hook.ema.steps == 0
    _train(t, 2)
    assert hook.ema.steps == 2


class _Probe(Hook):
    """Records the weights the model holds while it is evaluated."""

    priority = "LOW"

    def __init__(self) -> None:
        self.seen: list[dict[str, torch.Tensor]] = []

    def before_val_iter(self, trainer, batch_idx, data_batch=None) -> None:
        self.seen.append(_weights(trainer.model))

    def before_test_iter(self, trainer, batch_idx, data_batch=None) -> None:
        self.seen.append(_weights(trainer.model))


@pytest.mark.parametrize("mode", ["val", "test"])
def test_evaluates_the_average_then_restores_training_weights(mode: str) -> None:
    hook, probe = EMAHook(momentum=0.3), _Probe()
    t = _trainer(hook, probe)
    ref, training = _train_beside_reference(t, hook, 0.3)
    loop = t.val_loop if mode == "val" else t.test_loop

    metrics = loop.run(t.ctx)

    for seen in probe.seen:
        for k, v in ref.avg.items():
            torch.testing.assert_close(seen[k], v, atol=1e-6, rtol=0)
    assert metrics[f"{mode}/mse"] == pytest.approx(_mse_with(ref.avg, loop), rel=1e-5)
    assert metrics[f"{mode}/mse"] != pytest.approx(_mse_with(training, loop), rel=1e-3)
    after = _weights(t.model)
    assert all(torch.equal(after[k], training[k]) for k in training)
    assert t.model.training  # EvalLoop restored the mode; the hook did not disturb it


def test_evaluate_on_both_reports_training_weights_too() -> None:
    hook = EMAHook(momentum=0.3, evaluate_on="both")
    t = _trainer(hook)
    ref, training = _train_beside_reference(t, hook, 0.3)

    metrics = t.val_loop.run(t.ctx)

    assert set(metrics) == {"val/mse", "val/raw/mse"}
    assert metrics["val/mse"] == pytest.approx(_mse_with(ref.avg, t.val_loop), rel=1e-5)
    assert metrics["val/raw/mse"] == pytest.approx(_mse_with(training, t.val_loop), rel=1e-5)
    assert all(torch.equal(v, training[k]) for k, v in _weights(t.model).items())


@pytest.mark.parametrize("evaluate_on", ["ema", "both"])
def test_before_averaging_starts_the_model_itself_is_evaluated(evaluate_on: str) -> None:
    hook = EMAHook(momentum=0.3, begin_iter=100, evaluate_on=evaluate_on)
    t = _trainer(hook)
    hook.before_train(t)
    _train(t, 3)
    metrics = t.val_loop.run(t.ctx)
    expected = _mse_with(_weights(t.model), t.val_loop)
    assert metrics["val/mse"] == pytest.approx(expected, rel=1e-5)
    if evaluate_on == "both":
        assert metrics["val/raw/mse"] == metrics["val/mse"]


def test_error_during_evaluation_restores_training_weights_at_after_run() -> None:
    hook = EMAHook(momentum=0.3)
    t = _trainer(hook)
    hook.before_train(t)
    _train(t, 4)
    training = _weights(t.model)
    t.hooks.call("before_val_epoch", t)
    assert not torch.equal(t.model.net.weight, training["net.weight"])
    t.hooks.call("after_run", t)  # the trainer calls it also when a pass raised
    assert all(torch.equal(v, training[k]) for k, v in _weights(t.model).items())


@pytest.mark.parametrize("load_before_train", [True, False])
def test_resume_continues_the_average_exactly(load_before_train: bool) -> None:
    hook = EMAHook(momentum=0.25, interval=2)
    t = _trainer(hook)
    hook.before_train(t)
    _train(t, 5)
    buf = io.BytesIO()
    torch.save(
        {
            "model": t.model.state_dict(),
            "optim": t.optimizer.state_dict(),
            "progress": t.progress.state_dict(),
            "hook": hook.state_dict(),
        },
        buf,
    )
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)

    resumed_hook = EMAHook(momentum=0.25, interval=2)
    r = _trainer(resumed_hook, seed=123)  # different initial weights, overwritten by the checkpoint
    r.model.load_state_dict(ckpt["model"])
    r.optimizer.load_state_dict(ckpt["optim"])
    r.progress.load_state_dict(ckpt["progress"])
    if load_before_train:
        resumed_hook.load_state_dict(ckpt["hook"])
        assert resumed_hook.state_dict()["steps"] == 5  # pending state is still saved if asked
        resumed_hook.before_train(r)
    else:
        resumed_hook.before_train(r)
        resumed_hook.load_state_dict(ckpt["hook"])

    _train(t, 6)
    _train(r, 6)
    assert resumed_hook.ema.steps == hook.ema.steps == 11
    for k, v in hook.ema.averaged.items():
        assert torch.equal(resumed_hook.ema.averaged[k], v), k


def test_loaded_average_is_used_for_evaluation_without_training() -> None:
    hook = EMAHook(momentum=0.3)
    t = _trainer(hook)
    hook.before_train(t)
    _train(t, 4)
    state = hook.state_dict()
    averaged = {k: v.clone() for k, v in state["averaged"].items()}

    fresh = EMAHook(momentum=0.3)
    v = _trainer(fresh, seed=5)
    fresh.load_state_dict(state)
    metrics = v.val_loop.run(v.ctx)  # no before_train: a standalone validation
    assert metrics["val/mse"] == pytest.approx(_mse_with(averaged, v.val_loop), rel=1e-5)


def test_state_dict_is_empty_before_the_average_exists_and_hook_is_stateful() -> None:
    hook = EMAHook()
    assert hook.state_dict() == {}
    hook.load_state_dict({})  # a checkpoint without EMA state is fine
    assert hook.ema is None
    assert HookList([hook]).stateful() == [hook]
    assert hook.state_key == "EMAHook"


def test_registered_and_validated() -> None:
    hook = HOOKS.build(dict(type="EMAHook", momentum=0.01, evaluate_on="both"))
    assert isinstance(hook, EMAHook) and hook.momentum == 0.01
    with pytest.raises(ValueError, match="evaluate_on"):
        EMAHook(evaluate_on="raw")
    with pytest.raises(ValueError, match="1 - d"):
        EMAHook(momentum=0.0)
