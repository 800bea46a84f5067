"""The loops driven with a hand-built LoopContext: no Trainer, the same training as a hand-written loop."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.evaluation import Evaluator, Metric
from trainwright.hooks.dispatch import HookList
from trainwright.loops import EpochBasedTrainLoop, EvalLoop, IterBasedTrainLoop, LoopContext
from trainwright.utils.progress import Progress

LR = 0.05
TRAIN_EVENTS = (
    "before_train",
    "before_train_epoch",
    "before_train_iter",
    "after_train_iter",
    "after_train_epoch",
    "after_train",
)


class Calls(tw.Hook):
    """Records each event with the object it was called with, and stops after ``stop_at``."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.stop_at = stop_at
        self.calls: list[tuple[str, Any]] = []

    def before_train(self, trainer):
        self.calls.append(("before_train", trainer))

    def before_train_epoch(self, trainer):
        self.calls.append(("before_train_epoch", trainer))

    def before_train_iter(self, trainer, batch_idx, data_batch=None):
        self.calls.append(("before_train_iter", trainer))

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        self.calls.append(("after_train_iter", trainer))
        if trainer.progress.iteration == self.stop_at:
            trainer.should_stop = True

    def after_train_epoch(self, trainer):
        self.calls.append(("after_train_epoch", trainer))

    def after_train(self, trainer):
        self.calls.append(("after_train", trainer))

    def before_val_iter(self, trainer, batch_idx, data_batch=None):
        self.calls.append(("before_val_iter", trainer))

    def after_val_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        self.calls.append(("after_val_iter", trainer))
        if self.stop_at is not None and batch_idx + 1 == self.stop_at:
            trainer.should_stop = True

    def after_val_epoch(self, trainer, metrics=None):
        self.calls.append(("after_val_epoch", metrics))


class MSE(Metric):
    def process(self, data_batch, outputs) -> None:
        self.results.append(((outputs - data_batch[1]) ** 2).mean(1))

    def compute(self, results) -> dict[str, float]:
        return {"mse": float(torch.cat(results).mean())}


def _context(*hooks: tw.Hook, validate: Any = None) -> LoopContext:
    """A run's context built by hand: the view is a plain namespace holding the stop flag."""
    progress = Progress()
    model = LinearReg()
    view = types.SimpleNamespace(progress=progress, should_stop=False, flush_logs=lambda: None)
    ow = tw.OptimWrapper(torch.optim.SGD(model.parameters(), lr=LR))
    return LoopContext(
        view=view, model=model, hooks=HookList(hooks), progress=progress, optim_wrapper=ow, validate=validate
    )  # type: ignore[arg-type]


def _loader() -> DataLoader:
    return DataLoader(regression_set(20), batch_size=4)  # 5 batches


def _by_hand(iters: int) -> list[torch.Tensor]:
    """The reference: plain SGD over the batches in order, cycling the loader."""
    model = LinearReg()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    batches = list(_loader())
    for i in range(iters):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _params(ctx: LoopContext) -> list[torch.Tensor]:
    return [p.detach() for p in ctx.model.parameters()]


def test_epoch_loop_trains_exactly_like_a_hand_written_loop() -> None:
    ctx = _context()
    EpochBasedTrainLoop(_loader(), max_epochs=2).run(ctx)
    assert (ctx.progress.epoch, ctx.progress.iteration, ctx.progress.iter_in_epoch) == (2, 10, 0)
    assert all(torch.equal(a, b) for a, b in zip(_params(ctx), _by_hand(10), strict=True))
    assert ctx.metric_store.get("loss").count == 10  # every step recorded


def test_iter_loop_trains_exactly_like_a_hand_written_loop() -> None:
    ctx = _context()
    IterBasedTrainLoop(_loader(), max_iters=7).run(ctx)
    assert (ctx.progress.epoch, ctx.progress.iteration) == (1, 7)
    assert all(torch.equal(a, b) for a, b in zip(_params(ctx), _by_hand(7), strict=True))


@pytest.mark.parametrize("by_epoch", [True, False])
def test_hooks_get_the_view_of_the_context_in_order(by_epoch: bool) -> None:
    hook = Calls()
    ctx = _context(hook)
    loop = EpochBasedTrainLoop(_loader(), max_epochs=1) if by_epoch else IterBasedTrainLoop(_loader(), max_iters=5)
    loop.run(ctx)
    assert all(obj is ctx.view for _, obj in hook.calls)
    events = [e for e, _ in hook.calls]
    assert events == ["before_train", "before_train_epoch"] + ["before_train_iter", "after_train_iter"] * 5 + [
        "after_train_epoch",
        "after_train",
    ]


@pytest.mark.parametrize("by_epoch", [True, False])
def test_a_stop_set_by_a_hook_after_iteration_k_stops_there(by_epoch: bool) -> None:
    hook = Calls(stop_at=3)
    ctx = _context(hook)
    loop = EpochBasedTrainLoop(_loader(), max_epochs=4) if by_epoch else IterBasedTrainLoop(_loader(), max_iters=20)
    loop.run(ctx)
    assert ctx.progress.iteration == 3 and ctx.progress.epoch == 0
    assert [e for e, _ in hook.calls].count("after_train_iter") == 3
    assert hook.calls[-1][0] == "after_train"  # the run still ends properly
    assert all(torch.equal(a, b) for a, b in zip(_params(ctx), _by_hand(3), strict=True))


def test_validation_runs_when_due() -> None:
    seen: list[tuple[int, int]] = []
    ctx = _context(validate=lambda: seen.append((ctx.progress.epoch, ctx.progress.iteration)))
    EpochBasedTrainLoop(_loader(), max_epochs=5, val_interval=2).run(ctx)
    assert seen == [(2, 10), (4, 20), (5, 25)]  # every 2 epochs, and after the last

    seen.clear()
    ctx = _context(validate=lambda: seen.append((ctx.progress.epoch, ctx.progress.iteration)))
    IterBasedTrainLoop(_loader(), max_iters=7, val_interval=3).run(ctx)
    assert seen == [(0, 3), (1, 6), (1, 7)]  # every 3 iterations, and at max_iters


def test_dynamic_intervals_change_the_validation_interval_at_their_milestones_as_mmengine() -> None:
    """mmengine (RTMDet's ``dynamic_intervals=[(max_epochs - 20, 1)]``): after n completed epochs the interval is the
    entry for n + 1."""
    seen: list[int] = []
    ctx = _context(validate=lambda: seen.append(ctx.progress.epoch))
    EpochBasedTrainLoop(_loader(), max_epochs=8, val_interval=3, dynamic_intervals=[(5, 1)]).run(ctx)
    assert seen == [3, 4, 5, 6, 7, 8]  # every 3 epochs, then every epoch from epoch 4 (4 + 1 reaches the milestone 5)

    seen.clear()
    ctx = _context(validate=lambda: seen.append(ctx.progress.iteration))
    IterBasedTrainLoop(_loader(), max_iters=11, val_interval=4, dynamic_intervals=[(6, 3)]).run(ctx)
    assert seen == [4, 6, 9, 11]  # 4; from iteration 5 on every 3 (5 + 1 reaches 6): 6, 9; and at max_iters

    with pytest.raises(ValueError, match="dynamic_intervals must be"):
        EpochBasedTrainLoop(_loader(), max_epochs=2, dynamic_intervals=[(5, 1), (3, 2)])


def test_no_validation_without_a_runner_and_none_after_a_stop() -> None:
    loop = EpochBasedTrainLoop(_loader(), max_epochs=2)
    assert not loop.val_due()  # no run yet
    loop.run(_context())
    assert not loop.val_due()
    seen: list[int] = []
    ctx = _context(Calls(stop_at=5), validate=lambda: seen.append(ctx.progress.iteration))
    EpochBasedTrainLoop(_loader(), max_epochs=2).run(ctx)
    assert seen == [] and ctx.progress.epoch == 1  # the epoch completed, but a stop skips its validation


def test_eval_loop_with_a_hand_built_context() -> None:
    hook = Calls()
    ctx = _context(hook)
    loop = EvalLoop(DataLoader(regression_set(20), batch_size=5), Evaluator(MSE()), mode="val")
    with pytest.raises(RuntimeError, match="run_pass"):
        loop.run_pass()  # no context yet
    metrics = loop.run(ctx)
    x, y = regression_set(20).tensors
    with torch.no_grad():
        expected = float(((ctx.model(x) - y) ** 2).mean())
    assert metrics == {"val/mse": pytest.approx(expected, rel=1e-6)}
    assert [e for e, _ in hook.calls] == ["before_val_iter", "after_val_iter"] * 4 + ["after_val_epoch"]
    assert all(obj is ctx.view for e, obj in hook.calls if e != "after_val_epoch")
    assert ctx.model.training  # the mode it had before
    assert loop.run_pass(with_hooks=False) == {
        "mse": pytest.approx(expected, rel=1e-6)
    }  # the run's context is kept for hooks


def test_eval_loop_stop_request_ends_the_pass_without_metrics() -> None:
    hook = Calls(stop_at=2)
    ctx = _context(hook)
    loop = EvalLoop(DataLoader(regression_set(20), batch_size=5), Evaluator(MSE()), mode="val")
    assert loop.run(ctx) == {}
    assert [e for e, _ in hook.calls] == ["before_val_iter", "after_val_iter"] * 2 + ["after_val_epoch"]
    assert hook.calls[-1] == ("after_val_epoch", None)


# -- layering: the loops below the trainer, type-checking imports counted ----------------------
SRC = Path(tw.__file__).parent


def _imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, those under ``if TYPE_CHECKING:`` included."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_no_loop_module_imports_the_trainer_even_for_type_checking() -> None:
    offenders = {
        p.name: n
        for p in (SRC / "loops").glob("*.py")
        for n in _imported_modules(p)
        if n.startswith("trainwright.trainer")
    }
    assert not offenders


def test_lint_imports_counts_type_checking_imports_and_the_layers_hold() -> None:
    root = SRC.parent.parent
    pyproject = root / "pyproject.toml"
    if not pyproject.exists() or shutil.which("lint-imports") is None:
        pytest.skip("needs the source checkout and import-linter")
    assert re.search(r"^exclude_type_checking_imports = false$", pyproject.read_text(encoding="utf-8"), re.MULTILINE)
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    result = subprocess.run(
        ["lint-imports", "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
