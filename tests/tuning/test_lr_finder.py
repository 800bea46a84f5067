"""Trainer.find_lr: the trainer is left bitwise as it was, the suggestion agrees with a grid search, the plot, the
CLI, bad input."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import regression_set
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.cli import main
from trainwright.config import Config

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _same(a: Any, b: Any, where: str = "") -> None:
    """``a`` and ``b`` equal bitwise (tensors: same dtype and bits), recursively; ``meta.time`` aside."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(a), sorted(b))
        for k in a:
            if not (k == "time" and where.endswith(".meta")):
                _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), (where, a, b)


def _digits_trainer(work_dir: Path, **overrides: Any) -> tw.Trainer:
    cfg = Config.fromfile(
        DIGITS
    )  # dropout, SGD with momentum, gradient clipping, a warm-up and a cosine schedule, shuffled data
    return tw.Trainer.from_config(cfg, work_dir=str(work_dir), experiment_name="run", log_level="WARNING", **overrides)


@pytest.mark.slow
def test_train_after_find_lr_is_bitwise_train_without(tmp_path: Path) -> None:
    with _digits_trainer(tmp_path / "a", train_cfg=dict(by_epoch=True, max_epochs=2)) as tuned:
        result = tuned.find_lr(
            num_steps=60
        )  # more updates than one epoch's 45 batches: the loader starts a second pass
        assert len(result.lrs) == 60 and not result.stopped_early
        # nothing written: no checkpoint, no log record of the finder's steps
        assert not list((tmp_path / "a" / "checkpoints").glob("*.pth"))
        jsonl = tmp_path / "a" / "run" / "metrics.jsonl"
        assert not jsonl.exists() or not any(
            r["mode"] == "train" for r in map(json.loads, jsonl.read_text().splitlines())
        )
        assert tuned.progress.iteration == 0
        tuned_model = {k: v.clone() for k, v in tuned.train().state_dict().items()}
        tuned_optim = tuned.optim_wrapper.state_dict()
    with _digits_trainer(tmp_path / "b", train_cfg=dict(by_epoch=True, max_epochs=2)) as plain:
        plain_model = {k: v.clone() for k, v in plain.train().state_dict().items()}
        plain_optim = plain.optim_wrapper.state_dict()
    _same(tuned_model, plain_model)
    _same(tuned_optim, plain_optim)
    rows = [
        [
            r
            for r in map(json.loads, (tmp_path / d / "run" / "metrics.jsonl").read_text().splitlines())
            if r["mode"] in ("train", "val")
        ]
        for d in "ab"
    ]
    assert len(rows[0]) == len(rows[1]) > 0
    for x, y in zip(*rows):
        timing = ("time", "samples_per_s", "tflops", "mfu", "eta")
        same = [k for k in x if not any(t in k for t in timing)]
        assert "loss" in same or "val/acc" in same
        assert {k: x[k] for k in same} == {k: y.get(k) for k in same}  # losses, lr, grad_norm, val/acc


class Noisy(tw.BaseModel):
    """Dropout, BatchNorm, a non-persistent buffer counting samples and a parameter the optimizer does not hold."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        self.extra = nn.Parameter(torch.zeros(1))  # not in the optimizer: zero_grad never clears its gradient
        self.register_buffer("seen", torch.zeros(()), persistent=False)  # not in any state dict

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        if self.training:
            self.seen += len(x)
        out = self.net(x) + self.extra
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def _everything(trainer: tw.Trainer) -> dict[str, Any]:
    """The trainer's checkpoint pieces, and what a checkpoint does not hold: gradients, every buffer, train/eval
    flags, the window position, RNG."""
    model = trainer.unwrapped_model
    ow = trainer.optim_wrapper
    return {
        "checkpoint": trainer.checkpoints.capture(),
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "buffers": [b.clone() for b in model.buffers()],
        "training": [m.training for m in model.modules()],
        "window": (ow.inner_count, ow.max_counts, ow.skipped_steps),
        "loader": trainer.train_loop.dataloader.state_dict(),
        "lrs": [g["lr"] for g in ow.optimizer.param_groups],
        "python": random.getstate(),
        "numpy": np.random.get_state()[1].tolist(),
        "torch": torch.get_rng_state(),
    }


@pytest.mark.filterwarnings(
    "ignore:Gradient accumulation:UserWarning"
)  # BatchNorm with accumulation: wanted here (its running statistics)
def test_find_lr_after_training_restores_everything(trainer_factory: Any) -> None:
    model = Noisy()
    ow = tw.OptimWrapper(torch.optim.SGD(model.net.parameters(), lr=0.05, momentum=0.9), accumulative_counts=2)
    trainer = trainer_factory(
        model=model,
        dataset=regression_set(20),
        batch_size=4,
        shuffle=True,
        optim_wrapper=ow,
        train_cfg=dict(by_epoch=False, max_iters=12),
        param_scheduler=dict(type="LinearLR", start_factor=0.5, by_epoch=False, begin=0, end=20),
    )
    trainer.train()  # stops in the middle of the loader's third epoch, the warm-up half done
    model.eval()
    model.net[1].train()  # mixed flags: the finder switches everything to train mode
    before = _everything(trainer)
    assert (
        before["grads"][0] is not None and before["grads"][-1] is None
    )  # extra's gradient (listed first) stays; the optimizer's were cleared
    result = trainer.find_lr(num_steps=12, max_lr=10.0)
    assert model.seen.item() > 0 and len(result.lrs) >= 2
    _same(_everything(trainer), before)


class RecordingSGD(torch.optim.SGD):
    """SGD that records every group's lr at each step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[list[float]] = []

    def step(self, closure: Any = None) -> Any:  # noqa: D102
        self.steps.append([g["lr"] for g in self.param_groups])
        return super().step(closure)


def test_every_param_group_ramps_keeping_its_ratio(trainer_factory: Any) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = RecordingSGD([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.01}], lr=0.1)

    class Reg(tw.BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
            return {"loss": F.mse_loss(self.m(x), y)} if mode == "loss" else self.m(x)

    trainer = trainer_factory(model=Reg(), batch_size=4, optim_wrapper=tw.OptimWrapper(opt))
    result = trainer.find_lr(min_lr=1e-4, max_lr=1e-1, num_steps=10, diverge=None)
    assert len(opt.steps) == 10 and not result.stopped_early
    assert [s[0] for s in opt.steps] == result.lrs  # one optimizer step per update, through the run's update path
    assert result.lrs[0] == pytest.approx(1e-4) and result.lrs[-1] == pytest.approx(1e-1)
    assert all(b / a == pytest.approx(0.1) for a, b in opt.steps)  # the second group keeps its 1/10
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01]  # and the lrs are back


def test_diverging_loss_stops_early(trainer_factory: Any) -> None:
    trainer = trainer_factory(batch_size=4, shuffle=True)
    result = trainer.find_lr(min_lr=1e-3, max_lr=1e4, num_steps=80)
    assert result.stopped_early and 2 <= len(result.lrs) < 80
    last = result.losses[-1]
    assert not math.isfinite(last) or last > 4.0 * min(result.losses[:-1])
    assert result.lrs[-1] < 1e4


def test_suggestion_ignores_a_spike_and_a_lucky_batch_past_the_minimum() -> None:
    """Breast cancer with Adam: the loss falls, bottoms out, then a spike and a near-zero batch dip the smoothed loss
    on the cliff."""
    from trainwright.tuning import LRFinderResult

    lrs = [10 ** (-4 + 4 * i / 39) for i in range(40)]
    losses = [1.0 - 0.8 * min(i, 25) / 25 for i in range(30)] + [
        0.3,
        0.5,
        0.9,
        1.4,
        2.0,
        2.6,
        3.0,
        3.4,
        2.2,
        40.0,
    ]  # min at 25..29
    result = LRFinderResult(lrs=lrs, losses=losses, raw_losses=losses)
    # the steep drop 37 -> 38 (a lucky batch after the spike) is past the minimum: not a candidate
    assert result.suggestion is not None and result.suggestion < lrs[25]
    assert result.suggestion == lrs[result._index] and 10 <= result._index <= 25


def test_an_outlier_batch_at_the_start_is_named_as_the_likely_cause(trainer_factory: Any) -> None:
    x, y = regression_set().tensors
    y = y.clone()
    y[4:6] *= 1000.0  # the third batch (of 2 samples) is an outlier
    trainer = trainer_factory(dataset=TensorDataset(x, y), batch_size=2, log_level="INFO")
    result = trainer.find_lr(min_lr=1e-6, max_lr=1e-3, num_steps=50)
    assert result.stopped_early and len(result.lrs) == 3 and result.suggestion is None
    trainer.flush_logs()
    (line,) = [ln for ln in (trainer.run_dir / "train.log").read_text().splitlines() if "LR finder:" in ln]
    assert (
        "no suggestion: the loss jumped at update 3" in line
        and "one outlier batch is the likelier cause than the lr" in line
    )
    assert "pass diverge=None" in line


@pytest.mark.slow
def test_suggestion_within_a_decade_of_the_grid_best(tmp_path: Path) -> None:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x, dtype=torch.float32) / 16.0, torch.tensor(y)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, (xv, yv) = TensorDataset(x[perm[360:]], y[perm[360:]]), (x[perm[:360]], y[perm[:360]])

    class MLP(tw.BaseModel):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
            return {"loss": F.cross_entropy(self.net(x), y)} if mode == "loss" else self.net(x)

    def val_loss_after_one_epoch(lr: float) -> float:  # a hand-written loop: the reference
        model = MLP()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        for xb, yb in DataLoader(train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)):
            loss = F.cross_entropy(model.net(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            loss = F.cross_entropy(model.net(xv), yv).item()
        return loss if math.isfinite(loss) else math.inf

    grid = {10 ** (e / 2): val_loss_after_one_epoch(10 ** (e / 2)) for e in range(-8, 1)}  # 1e-4 .. 1, half decades
    best = min(grid, key=grid.__getitem__)
    with tw.Trainer(
        MLP(),
        work_dir=tmp_path,
        train_dataloader=dict(dataset=train, batch_size=32, shuffle=True),
        optim_wrapper=dict(optimizer=dict(type="Adam", lr=1e-3)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        randomness=dict(seed=0),
        log_level="WARNING",
    ) as trainer:
        result = trainer.find_lr()
    suggestion = result.suggestion
    assert suggestion is not None
    assert abs(math.log10(suggestion) - math.log10(best)) <= 1.0, (suggestion, best, grid)
    # the plot: a PNG with the curve
    out = result.plot(tmp_path / "plots" / "lr.png")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_plot_writes_a_png(trainer_factory: Any, tmp_path: Path) -> None:
    result = trainer_factory(batch_size=4).find_lr(num_steps=20)
    out = result.plot(tmp_path / "lr.png")
    assert out == tmp_path / "lr.png" and out.read_bytes()[:8] == PNG_MAGIC
    import matplotlib.image

    img = matplotlib.image.imread(out)
    assert img.shape[0] > 200 and img[..., :3].std() > 0.05  # a drawing, not a blank canvas


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(min_lr=1.0, max_lr=0.1), "min_lr < max_lr"),
        (dict(min_lr=0.1, max_lr=0.1), "min_lr < max_lr"),
        (dict(num_steps=1), "num_steps must be an int >= 2"),
        (dict(min_lr=0.0), "min_lr must be > 0 for the exponential ramp"),
        (dict(mode="cosine"), "mode must be 'exp'"),
        (dict(smooth=0.0), "smooth must be in"),
        (dict(diverge=1.0), "diverge must be a number > 1"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_built(
    trainer_factory: Any, kwargs: dict[str, Any], message: str
) -> None:
    trainer = trainer_factory()
    with pytest.raises(ValueError, match=message):
        trainer.find_lr(**kwargs)
    assert trainer.train_loop is None and not trainer.prepared


def test_tuners_refuse_to_start_inside_a_run(trainer_factory: Any) -> None:
    """Called from a hook while train() runs: a clear error (the run's loader and optimizer are in use), raised out
    of train()."""
    calls: list[str] = []

    class TuneMidRun(tw.Hook):
        def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
            for name, call in (("find_lr", trainer.find_lr), ("find_batch_size", trainer.find_batch_size)):
                with pytest.raises(
                    RuntimeError,
                    match=rf"{name}\(\) was called while train\(\) / val\(\) / test\(\) runs "
                    r".*before train\(\) or after it returns",
                ):
                    call()
                calls.append(name)
            trainer.should_stop = True

    trainer = trainer_factory(custom_hooks=[TuneMidRun()])
    trainer.train()
    assert calls == ["find_lr", "find_batch_size"]
    assert trainer.find_lr(num_steps=3, diverge=None).lrs  # after the run returned: allowed


def test_linear_ramp(trainer_factory: Any) -> None:
    result = trainer_factory(batch_size=4).find_lr(min_lr=0.0, max_lr=0.1, num_steps=5, mode="linear", diverge=None)
    assert result.lrs == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1])


@pytest.mark.slow
def test_cli_tune_lr_prints_the_suggestion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["tune-lr", str(DIGITS), "--work-dir", "wd", "--num-steps", "30", "--out", "lr.png"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("suggested lr: "))
    assert 1e-6 <= float(line.split()[2]) <= 1.0
    assert "wrote lr.png" in out and (tmp_path / "lr.png").read_bytes()[:8] == PNG_MAGIC
    assert not list((tmp_path / "wd" / "checkpoints").glob("*.pth"))

    assert main(["tune-lr", str(DIGITS), "--work-dir", "wd", "--num-steps", "1"]) == 2
    assert "num_steps must be an int >= 2" in capsys.readouterr().err


def test_spike_guard_skips_none_of_the_finders_updates(trainer_factory: Any) -> None:
    model = nn.Linear(4, 1)
    opt = RecordingSGD(model.parameters(), lr=0.01)

    class Reg(tw.BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
            return {"loss": F.mse_loss(self.m(x), y)} if mode == "loss" else self.m(x)

    trainer = trainer_factory(
        model=Reg(),
        batch_size=4,
        optim_wrapper=tw.OptimWrapper(opt),
        spike_guard=dict(window=5, threshold=0.5, min_history=3),
    )
    result = trainer.find_lr(
        min_lr=1e-3, max_lr=1e3, num_steps=40
    )  # the loss grows by orders of magnitude: spikes for the guard
    assert result.stopped_early and len(opt.steps) == len(result.lrs)  # every update stepped
    assert trainer.spike_guard is not None and trainer.spike_guard.skipped == 0
    assert trainer.optim_wrapper.spike_guard is trainer.spike_guard  # attached again afterwards
