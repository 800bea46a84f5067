"""A training script written against detectron2's engine API (``SimpleTrainer``, ``HookBase``, stock hooks), run on
trainwright.engine.

Each test writes the script as a detectron2 user would and compares it with the loop it stands
for, written out by hand here.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainwright.checkpoint.io import load_file
from trainwright.engine import (
    AMPTrainer,
    Checkpointer,
    CommonMetricPrinter,
    HookBase,
    JSONWriter,
    SimpleTrainer,
    get_event_storage,
    hooks,
)

N = 4  # iterations per train() call; the loader has 3 batches, so passes restart inside a call


class TwoLosses(nn.Module):
    """detectron2's model contract: called with the batch, returns a dict of losses in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        out = self.net(x)
        return {"loss_mse": ((out - y) ** 2).mean(), "loss_l1": (out - y).abs().mean()}


def _data(nan_at: int | None = None) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 4, generator=g), torch.randn(12, 1, generator=g)
    if nan_at is not None:
        x[nan_at * 4] = float("nan")
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)


def _build(lr: float = 0.1) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = TwoLosses()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)


class Counter(HookBase):
    """Counts its events and checks what detectron2 hooks rely on at each one."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(("before_train", "before_step", "after_backward", "after_step", "after_train"), 0)
        self.iters: list[int] = []

    def before_train(self) -> None:
        self.counts["before_train"] += 1

    def before_step(self) -> None:
        self.counts["before_step"] += 1
        assert self.trainer.storage.iter == self.trainer.iter  # detectron2's invariant

    def after_backward(self) -> None:
        self.counts["after_backward"] += 1
        assert all(p.grad is not None for p in self.trainer.model.parameters())

    def after_step(self) -> None:
        self.counts["after_step"] += 1
        self.iters.append(self.trainer.iter)
        get_event_storage().put_scalar("seen", self.trainer.iter)

    def after_train(self) -> None:
        self.counts["after_train"] += 1

    def state_dict(self) -> dict[str, Any]:
        return {"after_step": self.counts["after_step"]}

    def load_state_dict(self, state_dict: Any) -> None:
        self.counts["after_step"] = state_dict["after_step"]


def _reference(
    steps: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    batches: Any,
    autocast: Any = None,
    scaler: Any = None,
) -> list[float]:
    """The loop SimpleTrainer / AMPTrainer stand for, written out; returns the totals of the losses."""
    totals = []
    for _, data in zip(range(steps), batches):
        with autocast() if autocast else torch.enable_grad():
            loss_dict = model(data)
            losses = sum(loss_dict.values())
        opt.zero_grad()
        (scaler.scale(losses) if scaler else losses).backward()
        totals.append(sum(v.item() for v in loss_dict.values()))
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if sched is not None:
            sched.step()
    return totals


def test_simple_trainer_script_continues_across_train_calls_and_equals_the_hand_written_loop() -> None:
    model, opt, sched = _build()
    trainer = SimpleTrainer(model, _data(), opt)
    counter = Counter()
    trainer.register_hooks([hooks.IterationTimer(warmup_iter=2), None, hooks.LRScheduler(scheduler=sched), counter])
    trainer.train(0, N)
    first = trainer.storage
    trainer.train(N, 2 * N)

    assert counter.counts == {
        "before_train": 2,
        "before_step": 2 * N,
        "after_backward": 2 * N,
        "after_step": 2 * N,
        "after_train": 2,
    }
    assert counter.iters == list(range(2 * N))
    assert trainer.iter == 2 * N and trainer.start_iter == N and trainer.max_iter == 2 * N

    ref_model, ref_opt, ref_sched = _build()
    totals = _reference(2 * N, ref_model, ref_opt, ref_sched, itertools.cycle(list(_data())))
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)

    # each train() has its own storage: (value, iteration) pairs as detectron2's
    storage = trainer.storage
    assert [it for _, it in storage.history("total_loss").values()] == list(range(N, 2 * N))
    assert [v for v, _ in first.history("total_loss").values()] == pytest.approx(totals[:N], rel=1e-6)
    assert [v for v, _ in storage.history("total_loss").values()] == pytest.approx(totals[N:], rel=1e-6)
    assert storage.history("lr").values() == [(0.1 * 0.5 ** (i // 3), i) for i in range(N, 2 * N)]
    assert {"loss_mse", "loss_l1", "data_time", "rank_data_time", "time", "seen"} <= set(storage.latest())
    assert storage.latest()["seen"] == (2 * N - 1, 2 * N - 1)
    assert len(first.history("time").values()) == N - 1  # warmup_iter=2: the first step of each call is not timed
    assert storage.smoothing_hints()["lr"] is False
    assert storage.history("loss_mse").global_avg() == pytest.approx(
        sum(v for v, _ in storage.history("loss_mse").values()) / N
    )
    with pytest.raises(KeyError, match="No history metric available for 'nope'"):
        storage.history("nope")


def test_nan_loss_raises_naming_the_iteration_and_the_losses_before_the_step(caplog: pytest.LogCaptureFixture) -> None:
    model, opt, _ = _build()
    trainer = SimpleTrainer(model, _data(nan_at=2), opt)
    counter = Counter()
    trainer.register_hooks([counter])
    with (
        caplog.at_level(logging.ERROR, logger="trainwright.engine"),
        pytest.raises(FloatingPointError, match=r"at iteration=2!\nloss_dict = \{'loss_mse': nan, 'loss_l1': nan\}"),
    ):
        trainer.train(0, N)
    assert counter.counts["after_train"] == 1 and counter.counts["after_step"] == 2  # after_train runs in the finally
    assert trainer.iter == 2
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the optimizer did not step on it
    assert "Exception during training at iteration 2" in caplog.text


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_amp_trainer_on_cpu_equals_autocast_loop(dtype: torch.dtype) -> None:
    model, opt, _ = _build(lr=0.05)
    trainer = AMPTrainer(model, _data(), opt, precision=dtype)
    trainer.train(0, N)
    ref_model, ref_opt, _ = _build(lr=0.05)
    scaler = torch.amp.GradScaler("cpu") if dtype == torch.float16 else None
    _reference(
        N,
        ref_model,
        ref_opt,
        None,
        itertools.cycle(list(_data())),
        autocast=lambda: torch.autocast("cpu", dtype=dtype),
        scaler=scaler,
    )
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)
    assert math.isfinite(trainer.storage.history("total_loss").latest())
    state = trainer.state_dict()
    assert state["iteration"] == N and ("scale" in state["grad_scaler"]) == (dtype == torch.float16)


def test_checkpointer_resume_continues_exactly(tmp_path: Path) -> None:
    """detectron2's resume: PeriodicCheckpointer files, resume_or_load, then train(trainer.iter + 1, max_iter)."""
    batches = list(itertools.islice(itertools.cycle(list(_data())), 2 * N))

    def script(out: Path, data: list[Any], start: int, max_iter: int) -> tuple[SimpleTrainer, Counter, nn.Module]:
        model, opt, sched = _build()
        trainer = SimpleTrainer(model, data, opt)
        counter = Counter()
        checkpointer = Checkpointer(model, out, trainer=trainer)
        trainer.register_hooks(
            [
                hooks.LRScheduler(scheduler=sched),
                counter,
                hooks.PeriodicCheckpointer(checkpointer, period=2, max_to_keep=1),
            ]
        )
        checkpointer.resume_or_load("", resume=True)
        trainer.train(trainer.iter + 1 if checkpointer.has_checkpoint() else start, max_iter)
        return trainer, counter, model

    whole, whole_count, whole_model = script(tmp_path / "whole", batches, 0, 2 * N)
    _, _, _ = script(tmp_path / "cut", batches[:N], 0, N)
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == [
        "last_checkpoint",
        f"model_{N - 1:07d}.pth",
        "model_final.pth",
    ]
    saved = load_file(tmp_path / "cut" / "model_final.pth")  # weights_only: no code from the file
    assert saved["iteration"] == N - 1 and saved["trainer"]["iteration"] == N - 1
    assert saved["trainer"]["hooks"]["Counter"] == {"after_step": N}

    resumed, resumed_count, resumed_model = script(
        tmp_path / "cut", batches[N:], 0, 2 * N
    )  # the data position is the loader's: here, the rest
    assert resumed.start_iter == N and resumed_count.counts["after_step"] == 2 * N == whole_count.counts["after_step"]
    for p, q in zip(resumed_model.parameters(), whole_model.parameters()):
        assert torch.equal(p, q)
    assert resumed.storage.history("lr").values() == whole.storage.history("lr").values()[N:]


def test_eval_callback_and_writer_hooks_put_and_write_results_at_their_iterations(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, opt, _ = _build()
    trainer = SimpleTrainer(model, _data(), opt, gather_metric_period=2)
    calls: list[int] = []
    trainer.register_hooks(
        [
            hooks.IterationTimer(warmup_iter=1),
            hooks.EvalHook(3, lambda: {"val": {"acc": float(len(calls))}}),
            hooks.CallbackHook(after_step=lambda t: calls.append(t.iter)),
            hooks.PeriodicWriter([JSONWriter(tmp_path / "metrics.json"), CommonMetricPrinter(2 * N)], period=4),
        ]
    )
    with caplog.at_level(logging.INFO, logger="trainwright.engine"):
        trainer.train(0, 2 * N)
    # every 3 iterations (its after_step runs before the callback's of that iteration), and after the last
    assert trainer.storage.history("val/acc").values() == [(2.0, 2), (5.0, 5), (8.0, 2 * N)]
    assert [it for _, it in trainer.storage.history("total_loss").values()] == [1, 3, 5, 7]  # gather_metric_period=2
    assert calls == list(range(2 * N))

    # written at iterations 3 and 7 and after training: each iteration's latest values once, losses as medians
    lines = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [2, 3, 5, 7, 8]
    assert [line.get("val/acc") for line in lines] == [2.0, None, 5.0, None, 8.0]
    losses = trainer.storage.history("total_loss").values()
    assert lines[1]["total_loss"] == pytest.approx(statistics.median(v for v, it in losses if it <= 3))
    assert lines[3]["total_loss"] == pytest.approx(statistics.median(v for v, _ in losses))
    printed = [r.getMessage() for r in caplog.records if "iter: " in r.getMessage()]
    assert [m.split("  ")[1] for m in printed] == ["iter: 3", "iter: 7"]  # not again after training
    assert printed[1].startswith("eta: 0:00:00  iter: 7  total_loss: ")
    assert all(f"  {k}: " in printed[0] for k in ("loss_mse", "loss_l1", "time", "data_time"))


def test_wrong_inputs_name_the_fix() -> None:
    model, opt, _ = _build()
    trainer = SimpleTrainer(model, _data(), opt)
    with pytest.raises(TypeError, match="Subclass trainwright.engine.HookBase"):
        trainer.register_hooks([object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="yielded no batch"):
        SimpleTrainer(model, [], opt).train(0, 1)
    with pytest.raises(RuntimeError, match="get_event_storage\\(\\) was called outside training"):
        get_event_storage()
    with pytest.raises(ValueError, match="0 <= start_iter <= max_iter"):
        trainer.train(3, 1)
