"""Trainer end to end: NaN handling, basic resume, plain modules, several optimizers.

References are hand-written torch loops or an uninterrupted run of the same config.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import LinearReg, params_of, regression_set
from torch import nn

import trainwright as tw
from trainwright.checkpoint.io import load_file


# -- NaN / Inf -----------------------------------------------------------------------------
class NanAt(LinearReg):
    """Returns a NaN loss on its ``bad``-th training forward (1-based)."""

    def __init__(self, bad: int) -> None:
        super().__init__()
        self.bad = bad
        self.calls = 0

    def forward(self, x, y=None, mode="tensor"):
        out = super().forward(x, y, mode)
        if mode == "loss":
            self.calls += 1
            if self.calls == self.bad:
                out = {"loss": out["loss"] * float("nan"), "loss_reg": torch.tensor(0.25)}
            else:
                out = {"loss": out["loss"], "loss_reg": torch.tensor(0.25)}
        return out


def test_nan_loss_raises_naming_iteration_and_losses(trainer_factory):
    t = trainer_factory(model=NanAt(7), train_cfg=dict(max_epochs=2))
    with pytest.raises(FloatingPointError, match=r"iteration 7: \{'loss': nan, 'loss_reg': 0.25\}"):
        t.train()
    # detected at the next flush (logging interval 10), never later than that
    assert t.progress.iteration <= 10


def test_nan_loss_skip_skips_the_step(trainer_factory):
    model = NanAt(7)
    ref = copy.deepcopy(model)
    t = trainer_factory(model=model, nonfinite_loss="skip", train_cfg=dict(max_epochs=2))
    with pytest.warns(RuntimeWarning, match="non-finite"):
        t.train()
    assert t.progress.iteration == 20 and t.optim_wrapper.skipped_steps == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # reference: the same SGD loop with iteration 7 left out
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    x, y = regression_set().tensors
    for it in range(20):
        b = it % 10
        if it + 1 == 7:
            continue
        (F.mse_loss(ref.linear(x[2 * b : 2 * b + 2]), y[2 * b : 2 * b + 2]) + 0.25).backward()
        opt.step()
        opt.zero_grad()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


# -- resume --------------------------------------------------------------------------------
class Snapshot(tw.Hook):
    """Copies progress, optimizer and scheduler states at a given epoch end (after the checkpoint) or at train start."""

    priority = "LOWEST"

    def __init__(self, at_epoch: int | None = None, at_iter: int | None = None) -> None:
        self.at_epoch, self.at_iter = at_epoch, at_iter
        self.state: dict | None = None

    def _take(self, trainer):
        self.state = copy.deepcopy(
            {
                "progress": trainer.progress.state_dict(),
                "optim": trainer.optim_wrapper.state_dict(),
                "sched": [s.state_dict() for s in trainer.param_schedulers or []],
                "lr": trainer.optim_wrapper.get_lr(),
            }
        )

    def before_train(self, trainer):
        if self.at_epoch is None and self.at_iter is None:
            self._take(trainer)

    def after_train_epoch(self, trainer):
        if trainer.progress.epoch == self.at_epoch:
            self._take(trainer)

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        if trainer.progress.iteration == self.at_iter:
            self._take(trainer)


def _assert_states_equal(a, b):
    assert a["progress"] == b["progress"]
    assert a["lr"] == b["lr"]
    assert a["sched"] == b["sched"]
    oa, ob = a["optim"], b["optim"]
    assert "inner_count" not in oa and "inner_count" not in ob  # the position lives in progress only
    assert oa["optimizer"]["param_groups"] == ob["optimizer"]["param_groups"]
    for k, st in oa["optimizer"]["state"].items():
        for name, v in st.items():
            torch.testing.assert_close(v, ob["optimizer"]["state"][k][name], atol=0, rtol=0)


def _resume_cfg(**over):
    cfg = dict(
        batch_size=4,
        dataset=regression_set(28),  # 7 iterations per epoch
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9), clip_grad=dict(max_norm=5.0)),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.2, by_epoch=False, begin=0, end=10),
            dict(type="CosineAnnealingLR", by_epoch=True, begin=0, end=4),
        ],
        train_cfg=dict(by_epoch=True, max_epochs=4),
        default_hooks=dict(checkpoint=dict(interval=1)),
    )
    cfg.update(over)
    return cfg


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_by_epoch_continues_exactly(trainer_factory, tmp_path, shuffle):
    snap_a = Snapshot(at_epoch=2)
    a = trainer_factory(
        model=LinearReg(), work_dir=tmp_path / "a", shuffle=shuffle, custom_hooks=[snap_a], **_resume_cfg()
    )
    a.train()
    ckpt = tmp_path / "a" / "checkpoints" / "epoch_2.pth"
    assert ckpt.exists()

    snap_b = Snapshot()
    b = trainer_factory(
        model=LinearReg(seed=123),
        work_dir=tmp_path / "b",
        shuffle=shuffle,
        custom_hooks=[snap_b],
        resume=str(ckpt),
        **_resume_cfg(),
    )
    b.train()
    assert snap_b.state["progress"] == {"epoch": 2, "iteration": 14, "iter_in_epoch": 0}
    _assert_states_equal(snap_a.state, snap_b.state)
    for pa, pb in zip(a.unwrapped_model.parameters(), b.unwrapped_model.parameters()):
        assert torch.equal(pa, pb)
    assert b.progress.state_dict() == a.progress.state_dict()


def test_resume_by_iteration_mid_accumulation_window(trainer_factory, tmp_path):
    """Checkpoint at iteration 5 of windows of 2: partial gradients and the counter carry over."""
    cfg = _resume_cfg(
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9), accumulative_counts=2),
        param_scheduler=[dict(type="LinearLR", start_factor=0.2, by_epoch=False, begin=0, end=10)],
        train_cfg=dict(by_epoch=False, max_iters=17),
        default_hooks=dict(checkpoint=dict(interval=5, by_epoch=False)),
    )
    snap_a = Snapshot(at_iter=5)
    a = trainer_factory(model=LinearReg(), work_dir=tmp_path / "a", custom_hooks=[snap_a], **cfg)
    a.train()
    ckpt = tmp_path / "a" / "checkpoints" / "iter_5.pth"
    assert "partial_grads" in load_file(ckpt)["optim_wrapper"]

    snap_b = Snapshot()
    b = trainer_factory(
        model=LinearReg(seed=5), work_dir=tmp_path / "b", custom_hooks=[snap_b], resume=str(ckpt), **cfg
    )
    b.train()
    _assert_states_equal(snap_a.state, snap_b.state)
    for pa, pb in zip(a.unwrapped_model.parameters(), b.unwrapped_model.parameters()):
        assert torch.equal(pa, pb)


# -- plain nn.Module / several optimizers ---------------------------------------------------
class PlainLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = LinearReg().linear

    def forward(self, x, y):
        return F.mse_loss(self.linear(x), y)


class PlainDict(PlainLoss):
    def forward(self, x, y):
        out = self.linear(x)
        return {"loss_mse": F.mse_loss(out, y), "loss_l1": 0.5 * F.l1_loss(out, y), "mae": F.l1_loss(out, y)}


def _ref_sgd(model, total_loss, epochs=1, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = regression_set().tensors
    for _ in range(epochs):
        for b in range(10):
            total_loss(model, x[2 * b : 2 * b + 2], y[2 * b : 2 * b + 2]).backward()
            opt.step()
            opt.zero_grad()
    return params_of(model)


def test_plain_module_returning_loss_tensor(trainer_factory):
    model = PlainLoss()
    ref = copy.deepcopy(model)
    t = trainer_factory(model=model)
    assert t.unwrapped_model is model
    assert t.train() is model and t.unwrapped_model is model
    expected = _ref_sgd(ref, lambda m, x, y: m(x, y))
    for a, b in zip(model.parameters(), expected):
        torch.testing.assert_close(a.detach(), b, atol=1e-6, rtol=0)
    assert set(t.unwrapped_model.state_dict()) == {"linear.weight", "linear.bias"}


def test_plain_module_returning_dict_of_losses(trainer_factory):
    model = PlainDict()
    ref = copy.deepcopy(model)
    t = trainer_factory(model=model, default_hooks=dict(checkpoint=None, logger=dict(interval=5)))
    t.train()
    expected = _ref_sgd(ref, lambda m, x, y: (lambda d: d["loss_mse"] + d["loss_l1"])(m(x, y)))
    for a, b in zip(model.parameters(), expected):
        torch.testing.assert_close(a.detach(), b, atol=1e-6, rtol=0)
    rec = json.loads((t.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert {"loss", "loss_mse", "loss_l1", "mae"} <= set(rec)


class TinyGAN(tw.BaseModel):
    """Generator maps noise to 2-d points; discriminator scores them. One step each per batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.generator = nn.Linear(3, 2)
        self.discriminator = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))

    def forward(self, *inputs, mode="tensor"):
        return self.generator(inputs[0])

    @staticmethod
    def d_loss(d, g, z, real):
        fake = g(z).detach()
        return F.softplus(-d(real)).mean() + F.softplus(d(fake)).mean()

    @staticmethod
    def g_loss(d, g, z):
        return F.softplus(-d(g(z))).mean()

    def train_step(self, data, optim_wrapper):
        z, real = self.data_preprocessor(data, True)
        optim_wrapper["discriminator"].zero_grad()
        loss_d = self.d_loss(self.discriminator, self.generator, z, real)
        optim_wrapper["discriminator"].update_params(loss_d)
        loss_g = self.g_loss(self.discriminator, self.generator, z)
        optim_wrapper["generator"].update_params(loss_g)
        return {"loss_d": loss_d.detach(), "loss_g": loss_g.detach()}


def test_optim_wrapper_dict_gan_matches_two_optimizer_loop(trainer_factory):
    g = torch.Generator().manual_seed(9)
    ds = torch.utils.data.TensorDataset(torch.randn(16, 3, generator=g), torch.randn(16, 2, generator=g) + 2.0)
    model = TinyGAN()
    ref = copy.deepcopy(model)
    t = trainer_factory(
        model=model,
        dataset=ds,
        batch_size=4,
        train_cfg=dict(max_epochs=2),
        default_hooks=dict(checkpoint=None, logger=dict(interval=4)),
        optim_wrapper=dict(
            generator=dict(optimizer=dict(type="SGD", lr=0.1)), discriminator=dict(optimizer=dict(type="Adam", lr=0.01))
        ),
    )
    t.train()
    assert isinstance(t.optim_wrapper, tw.OptimWrapperDict)
    assert {id(p) for p in t.optim_wrapper["generator"].optimizer.param_groups[0]["params"]} == {
        id(p) for p in model.generator.parameters()
    }

    opt_g = torch.optim.SGD(ref.generator.parameters(), lr=0.1)
    opt_d = torch.optim.Adam(ref.discriminator.parameters(), lr=0.01)
    for _ in range(2):
        for b in range(4):
            z, real = ds.tensors[0][4 * b : 4 * b + 4], ds.tensors[1][4 * b : 4 * b + 4]
            opt_d.zero_grad()
            TinyGAN.d_loss(ref.discriminator, ref.generator, z, real).backward()
            opt_d.step()
            opt_d.zero_grad()
            TinyGAN.g_loss(ref.discriminator, ref.generator, z).backward()
            opt_g.step()
            opt_g.zero_grad()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    rec = json.loads((t.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert {"loss_d", "loss_g", "generator.lr", "discriminator.lr"} <= set(rec)


def test_val_and_test_return_prefixed_metrics(trainer_factory):
    from conftest import classification_set
    from torch.utils.data import DataLoader

    class Clf(tw.BaseModel):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, x, y=None, mode="tensor"):
            logits = self.linear(x)
            return {"loss": F.cross_entropy(logits, y)} if mode == "loss" else logits

    ds = classification_set(12)
    model = Clf()
    t = trainer_factory(
        model=model,
        dataset=ds,
        val_dataloader=DataLoader(ds, batch_size=5),
        val_evaluator=tw.evaluation.Accuracy(),
        test_dataloader=DataLoader(ds, batch_size=5),
        test_evaluator=tw.evaluation.Accuracy(),
    )
    x, y = ds.tensors
    with torch.no_grad():
        expected = (model.linear(x).argmax(1) == y).float().mean().item()
    assert t.val() == {"val/acc": pytest.approx(expected)}
    assert t.test() == {"test/acc": pytest.approx(expected)}
