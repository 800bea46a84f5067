"""Gradient accumulation is exact: N micro-batches per update == one step on the concatenated batch.

References are hand-written torch loops over the same data in the same order.
"""

from __future__ import annotations

import copy
import io
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import LinearReg, make_trainer, params_of, regression_set
from torch import nn

from trainwright.optim import OptimWrapper

ACC = 4


def _windows(n_batches: int, acc: int) -> list[range]:
    return [range(s, min(s + acc, n_batches)) for s in range(0, n_batches, acc)]


def _reference(
    model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], windows: list[range], lr: float, momentum: float
) -> list[torch.Tensor]:
    """One SGD step per window on the concatenated window (mean loss over its samples)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for w in windows:
        x = torch.cat([batches[i][0] for i in w])
        y = torch.cat([batches[i][1] for i in w])
        F.mse_loss(model.linear(x), y).backward()
        opt.step()
        opt.zero_grad()
    return params_of(model)


def _batches(ds, bs: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(ds.tensors[0][i : i + bs], ds.tensors[1][i : i + bs]) for i in range(0, len(ds), bs)]


@pytest.mark.parametrize("n_samples", [16, 20], ids=["divisible", "tail"])
def test_trainer_accumulation_equals_concatenated_steps_per_epoch(trainer_factory, n_samples):
    """Epoch length 8 (divisible) and 10 (tail window of 2 in EVERY epoch), 3 epochs."""
    ds = regression_set(n_samples)
    model = LinearReg()
    ref_model = copy.deepcopy(model)
    trainer = trainer_factory(
        model=model,
        dataset=ds,
        batch_size=2,
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9), accumulative_counts=ACC),
        train_cfg=dict(by_epoch=True, max_epochs=3),
    )
    trainer.train()
    batches = _batches(ds, 2)
    windows = _windows(len(batches), ACC) * 3
    expected = _reference(ref_model, batches, windows, lr=0.05, momentum=0.9)
    for got, exp in zip(params_of(trainer.unwrapped_model), expected):
        torch.testing.assert_close(got, exp, atol=1e-6, rtol=0)


def test_tail_weighting_is_observable(trainer_factory):
    """Sanity of the reference: under-weighting the tail (divide by 4, Lightning #19987) differs."""
    ds = regression_set(20)
    model = LinearReg()
    ref_model = copy.deepcopy(model)
    trainer = trainer_factory(
        model=model,
        dataset=ds,
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9), accumulative_counts=ACC),
        train_cfg=dict(max_epochs=2),
    )
    trainer.train()
    batches = _batches(ds, 2)
    opt = torch.optim.SGD(ref_model.parameters(), lr=0.05, momentum=0.9)
    for w in _windows(len(batches), ACC) * 2:
        for i in w:
            (F.mse_loss(ref_model.linear(batches[i][0]), batches[i][1]) / ACC).backward()
        opt.step()
        opt.zero_grad()
    diff = max((a - b).abs().max().item() for a, b in zip(params_of(trainer.unwrapped_model), params_of(ref_model)))
    assert diff > 1e-4


def test_iteration_based_windows_span_the_run(trainer_factory):
    """By iteration: windows are aligned to the run (they cross passes over the data); the run's tail is scaled by
    its size."""
    ds = regression_set(20)
    model = LinearReg()
    ref_model = copy.deepcopy(model)
    trainer = trainer_factory(
        model=model,
        dataset=ds,
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9), accumulative_counts=ACC),
        train_cfg=dict(by_epoch=False, max_iters=14),
    )
    trainer.train()
    batches = _batches(ds, 2)
    stream = [batches[i % len(batches)] for i in range(14)]
    expected = _reference(ref_model, stream, _windows(14, ACC), lr=0.05, momentum=0.9)
    for got, exp in zip(params_of(trainer.unwrapped_model), expected):
        torch.testing.assert_close(got, exp, atol=1e-6, rtol=0)


# -- OptimWrapper unit level ---------------------------------------------------------------
def _wrapper(acc: int = ACC, lr: float = 0.0, model: nn.Module | None = None) -> tuple[OptimWrapper, nn.Module]:
    model = model if model is not None else LinearReg()
    return OptimWrapper(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), accumulative_counts=acc), model


def test_scale_loss_should_update_should_sync_inner_count():
    ow, model = _wrapper()
    ow.initialize_count_status(model, 0, 10)
    sizes = [4, 4, 4, 4, 4, 4, 4, 4, 2, 2]
    for i in range(10):
        assert ow.inner_count == i
        closes = (i + 1) % ACC == 0 or i + 1 == 10
        assert ow.should_sync() == closes
        scaled = ow.scale_loss(torch.tensor(8.0))
        assert scaled.item() == 8.0 / sizes[i]
        ow.backward(model.linear.weight.sum() * 0)
        assert ow.inner_count == i + 1
        assert ow.should_update() == closes


def test_initialize_count_status_mid_span():
    ow, model = _wrapper()
    with pytest.warns(UserWarning, match="resumes 1 micro-batch"):  # no gradients of the window's start are here
        ow.initialize_count_status(model, 9, 10)  # inside the short last window [8, 10)
    assert ow.inner_count == 9 and ow.max_counts == 10
    assert ow.scale_loss(torch.tensor(1.0)).item() == 0.5
    assert ow.should_sync()
    with pytest.warns(UserWarning, match="resumes 1 micro-batch"):
        ow.initialize_count_status(model, 5, 10)  # inside a full window [4, 8)
    assert ow.scale_loss(torch.tensor(1.0)).item() == 0.25
    assert not ow.should_sync()


def test_no_accumulation_leaves_loss_unscaled():
    ow, _ = _wrapper(acc=1)
    loss = torch.tensor(3.0)
    assert ow.scale_loss(loss) is loss
    assert ow.should_sync()


def test_update_params_window_equals_one_concatenated_step():
    ds = regression_set(8)
    ow, model = _wrapper(lr=0.1)
    ref = copy.deepcopy(model)
    ow.initialize_count_status(model, 0, 4)
    x, y = ds.tensors
    for i in range(4):
        ow.update_params(F.mse_loss(model.linear(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    F.mse_loss(ref.linear(x), y).backward()
    opt.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        assert a.grad is None  # zeroed (set to None) after the update


def test_state_dict_round_trip_mid_window():
    """Save after 2 of 4 micro-batches (partial grads + counter), restore into a fresh wrapper, finish the window."""
    ds = regression_set(8)
    x, y = ds.tensors
    ow, model = _wrapper(lr=0.1)
    ref = copy.deepcopy(model)
    fresh_model = copy.deepcopy(model)
    ow.initialize_count_status(model, 0, 8)
    # one full window first so the optimizer has momentum state
    for i in range(4):
        ow.update_params(F.mse_loss(model.linear(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]))
    for i in range(2):
        ow.update_params(F.mse_loss(model.linear(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]))
    state = ow.state_dict()
    assert "inner_count" not in state  # the position is the loop's Progress, handed back by initialize_count_status
    assert [g is not None for g in state["partial_grads"]] == [True, True]
    for g, p in zip(state["partial_grads"], model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=0, rtol=0)
    # through bytes with weights_only=True, as a checkpoint would go
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)

    with torch.no_grad():
        for p_fresh, p in zip(fresh_model.parameters(), model.parameters()):
            p_fresh.copy_(p)
    ow2, _ = _wrapper(lr=0.1, model=fresh_model)
    ow2.load_state_dict(loaded)
    ow2.initialize_count_status(fresh_model, 6, 8)  # what the train loop does from its Progress
    assert ow2.inner_count == 6 and ow2.max_counts == 8
    opt_state, opt_state2 = ow.optimizer.state_dict()["state"], ow2.optimizer.state_dict()["state"]
    for k in opt_state:
        torch.testing.assert_close(opt_state[k]["momentum_buffer"], opt_state2[k]["momentum_buffer"], atol=0, rtol=0)
    for i in range(2, 4):
        ow.update_params(F.mse_loss(model.linear(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]))
        ow2.update_params(F.mse_loss(fresh_model.linear(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]))
    # reference: two concatenated steps
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        F.mse_loss(ref.linear(x), y).backward()
        opt.step()
        opt.zero_grad()
    for a, b, r in zip(model.parameters(), fresh_model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
        torch.testing.assert_close(b, r, atol=1e-6, rtol=0)


def test_state_dict_at_window_boundary_has_no_partial_grads():
    ow, model = _wrapper(lr=0.1)
    ow.initialize_count_status(model, 0, 8)
    x, y = regression_set(8).tensors
    for i in range(4):
        ow.update_params(F.mse_loss(model.linear(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]))
    assert "partial_grads" not in ow.state_dict()


def test_load_bare_optimizer_state_dict():
    ow, model = _wrapper(lr=0.1)
    other = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.5)
    ow.load_state_dict(other.state_dict())
    assert ow.get_lr() == {"lr": [0.3]} and ow.get_momentum() == {"momentum": [0.5]}


def test_resume_inside_a_window_warns_only_when_its_gradients_are_lost() -> None:
    ow, model = _wrapper()
    ow.initialize_count_status(model, 0, 10)
    ow.update_params(model.linear(torch.ones(2, 4)).sum())  # one micro-batch into a window of 4
    state = ow.state_dict()
    assert "partial_grads" in state

    resumed, model2 = _wrapper()
    resumed.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.initialize_count_status(model2, 1, 10)  # the window's gradients were restored: exact, nothing to say
        _wrapper()[0].initialize_count_status(
            model2, 10, 10
        )  # at the span's end (its short last window was stepped there)
        _wrapper()[0].initialize_count_status(model2, 8, 10)  # at a window boundary

    lost, model3 = _wrapper()
    lost.load_state_dict(
        {k: v for k, v in state.items() if k != "partial_grads"}
    )  # e.g. saved by a run with accumulative_counts=1
    with pytest.warns(
        UserWarning,
        match=r"resumes 1 micro-batch\(es\) into an accumulation window of accumulative_counts=4 \(position 1 of 10\)",
    ):
        lost.initialize_count_status(model3, 1, 10)


class _BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.head = nn.Sequential(nn.Linear(3, 1), nn.BatchNorm1d(1))

    def forward(self, x, y=None, mode="tensor"):
        out = self.head(self.bn(self.fc(x)))
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


@pytest.mark.parametrize("acc", [1, 2])
def test_batch_norm_with_accumulation_warns_once_per_run_naming_the_layers(trainer_factory, acc: int) -> None:
    t = trainer_factory(
        model=_BNNet(),
        batch_size=4,
        train_cfg=dict(max_epochs=3),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01), accumulative_counts=acc),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.train()
    bn = [str(w.message) for w in caught if "BatchNorm" in str(w.message)]
    if acc == 1:
        assert bn == []
    else:
        assert len(bn) == 1, bn  # not once per epoch
        assert "accumulative_counts=2" in bn[0] and "(bn, head.1)" in bn[0]


def test_trainer_resume_with_another_accumulative_counts_warns_and_the_same_does_not(tmp_path) -> None:
    """The loop places the wrapper from Progress; the warning depends on whether the window's gradients came back."""

    def run(name: str, acc: int, resume: Any = False) -> list[str]:
        kw: dict[str, Any] = dict(
            model=LinearReg(),
            batch_size=2,
            resume=resume,
            experiment_name=name,
            train_cfg=dict(max_epochs=1),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01), accumulative_counts=acc),
            default_hooks=dict(checkpoint=dict(interval=3, by_epoch=False, max_keep_ckpts=-1)),
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with make_trainer(tmp_path / name, **kw) as t:
                t.train()
        return [str(w.message) for w in caught if "into an accumulation window" in str(w.message)]

    assert run("acc1", acc=1) == [] and run("acc2", acc=2) == []
    ckpt1, ckpt2 = (tmp_path / n / "checkpoints" / "iter_3.pth" for n in ("acc1", "acc2"))
    assert ckpt1.is_file() and ckpt2.is_file()
    assert (
        run("same", acc=2, resume=str(ckpt2)) == []
    )  # iteration 3 is inside a window of 2, and its gradients are in the checkpoint
    (lost,) = run(
        "changed", acc=2, resume=str(ckpt1)
    )  # saved without accumulation: the window's first gradient is not there
    assert "resumes 1 micro-batch(es) into an accumulation window of accumulative_counts=2 (position 3 of 10)" in lost
