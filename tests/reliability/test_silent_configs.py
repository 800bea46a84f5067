"""Configs that would train silently wrong, and quiet wrong answers (issue 27, items 10, 14, 15, 17).

Each test failed before its fix: a typo in ``custom_keys`` trained the layer it meant to
freeze; a scheduler window after the end of training never applied, without a word; a
misspelled hook or optimizer argument got no "did you mean"; ``Trainer(model=dict(...))``
was refused; a restore that failed once was skipped by the next run; the NaN error advised
clipping with clipping on; ``trainwright val`` without a checkpoint evaluated initial weights
without a word and ``trainwright plot`` merged that evaluation into the training curves; the
hook-timing table filled the log after every ``train()``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import LinearReg, regression_set
from torch import nn
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.cli.plot import load_records
from trainwright.evaluation import Metric
from trainwright.registry import MODELS

ROOT = Path(__file__).resolve().parents[2]


class TwoLayer(tw.BaseModel):
    """``head(backbone(x))`` with random (torch-seeded) initial weights."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, width), nn.ReLU())
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.head(self.backbone(x))
        if mode == "loss":
            return {"loss": torch.nn.functional.mse_loss(out, y)}
        return out


if "TwoLayerForReliability" not in MODELS:
    MODELS.register(TwoLayer, name="TwoLayerForReliability")


class MeanAbs(Metric):
    def process(self, data_batch: Any, outputs: Any) -> None:
        self.results.append(float((outputs - data_batch[1]).abs().mean()))

    def compute(self, results: list[Any]) -> dict[str, float]:
        return {"mae": sum(results) / len(results)}


def _trainer(work_dir: Path, **kwargs: Any) -> tw.Trainer:
    kwargs.setdefault("model", TwoLayer())
    kwargs.setdefault("train_dataloader", DataLoader(regression_set(), batch_size=4))
    kwargs.setdefault("optim_wrapper", dict(optimizer=dict(type="SGD", lr=0.05)))
    kwargs.setdefault("train_cfg", dict(by_epoch=True, max_epochs=2))
    kwargs.setdefault("default_hooks", dict(checkpoint=None))
    kwargs.setdefault("log_level", "WARNING")
    kwargs.setdefault("randomness", dict(seed=0))
    return tw.Trainer(work_dir=work_dir, **kwargs)


# -- 10. silent configs -------------------------------------------------------------------
def test_custom_key_matching_no_parameter_is_an_error_naming_close_names(tmp_path: Path) -> None:
    frozen_by_typo = dict(
        optimizer=dict(type="SGD", lr=0.1), paramwise_cfg=dict(custom_keys={"backbon.0": dict(lr_mult=0.0)})
    )
    t = _trainer(tmp_path, optim_wrapper=frozen_by_typo)
    with pytest.raises(
        KeyError, match=r"custom_keys\['backbon.0'\] matches no parameter of TwoLayer.*Close names: 'backbone.0'"
    ) as e:
        t.train()
    assert "'backbone.0.weight'" in str(e.value)  # the names it could have meant
    t.close()

    # a key close to no name (inherited from a base schedule for another model): applied to nothing, as mmengine does,
    # with a warning
    inherited = dict(
        optimizer=dict(type="SGD", lr=0.1), paramwise_cfg=dict(custom_keys={".absolute_pos_embed": dict(lr_mult=0.0)})
    )
    t = _trainer(tmp_path, optim_wrapper=inherited)
    with pytest.warns(
        UserWarning, match=r"custom_keys\['.absolute_pos_embed'\] matches no parameter of TwoLayer.*another model"
    ):
        t.train()
    assert t.progress.epoch == 2
    t.close()

    # the key spelled right freezes the layer (lr 0) and trains the rest
    t = _trainer(
        tmp_path,
        optim_wrapper=dict(
            optimizer=dict(type="SGD", lr=0.1), paramwise_cfg=dict(custom_keys={"backbone.0": dict(lr_mult=0.0)})
        ),
    )
    before = t.unwrapped_model.backbone[0].weight.detach().clone()
    head_before = t.unwrapped_model.head.weight.detach().clone()
    t.train()
    assert torch.equal(t.unwrapped_model.backbone[0].weight, before)
    assert not torch.equal(t.unwrapped_model.head.weight, head_before)
    t.close()


def test_scheduler_window_outside_the_run_warns_at_train_start(tmp_path: Path) -> None:
    schedulers = [
        dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=5),  # inside: no warning
        dict(
            type="MultiStepLR", milestones=[1], by_epoch=False, begin=100, end=200
        ),  # iterations; the run has 2 x 5 = 10
        dict(type="CosineAnnealingLR", T_max=3, by_epoch=True, begin=2),  # epochs; the run has 2
    ]
    t = _trainer(tmp_path, param_scheduler=schedulers)
    with pytest.warns(UserWarning) as record:
        t.train()
    msgs = [str(w.message) for w in record if "never applies" in str(w.message)]
    assert len(msgs) == 2, msgs
    assert "MultiStepLR" in msgs[0] and "[100, 200)" in msgs[0] and "10 iterations" in msgs[0]
    assert "CosineAnnealingLR" in msgs[1] and "[2, inf)" in msgs[1] and "max_epochs=2" in msgs[1]
    t.close()


def test_scheduler_window_inside_the_run_does_not_warn(tmp_path: Path) -> None:
    t = _trainer(
        tmp_path,
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=9, end=50),
            dict(type="StepLR", step_size=1, begin=1),
        ],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.train()
    t.close()


@pytest.mark.parametrize(
    ("kwargs", "bad", "meant"),
    [
        (dict(default_hooks=dict(checkpoint=dict(intervall=2))), "intervall", "interval"),
        (dict(custom_hooks=[dict(type="EMAHook", momentun=0.01)]), "momentun", "momentum"),
        (dict(optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentun=0.9))), "momentun", "momentum"),
        (
            dict(optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.1, weight_dacay=0.01))),
            "weight_dacay",
            "weight_decay",
        ),
    ],
)
def test_misspelled_hook_and_optimizer_arguments_name_the_closest(
    tmp_path: Path, kwargs: dict[str, Any], bad: str, meant: str
) -> None:
    with pytest.raises(
        TypeError, match=rf"unexpected keyword argument '{bad}'\. Did you mean '{meant}'\?.* accepts: .*{meant}"
    ):
        t = _trainer(tmp_path, **kwargs)
        t.train()


# -- 14. reproducibility: model dicts, and a model built before the seed -------------------
def test_model_dict_is_built_after_the_seed(tmp_path: Path) -> None:
    torch.manual_seed(12345)  # another state before the Trainer: the dict's weights must not depend on it
    t = _trainer(tmp_path, model=dict(type="TwoLayerForReliability", width=6), randomness=dict(seed=7))
    tw.seed_everything(7)
    reference = TwoLayer(width=6)
    assert isinstance(t.unwrapped_model, TwoLayer)
    for a, b in zip(t.unwrapped_model.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    t.train()
    t.close()


_FRESH_PROCESS = """
import sys, torch, trainwright as tw
sys.path[:0] = [{tests!r}, {here!r}]
from test_silent_configs import TwoLayer, _trainer
from pathlib import Path
how = sys.argv[1]
if how == "seeded_first":
    tw.seed_everything(3)
model = dict(type="TwoLayerForReliability") if how == "dict" else TwoLayer()
t = _trainer(Path(sys.argv[2]), model=model, randomness=dict(seed=3), log_level="INFO", experiment_name="run")
print("WEIGHTS", t.unwrapped_model.head.weight.sum().item())
t.close()
"""


def _fresh_processes(tmp_path: Path, runs: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[float, str]]:
    """Each ``(how, n)`` in its own fresh Python process (all started at once, each with its own unseeded torch): the
    head's weight sum and the run's train.log."""
    code = _FRESH_PROCESS.format(tests=str(ROOT / "tests"), here=str(Path(__file__).parent))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    env["OMP_NUM_THREADS"] = "1"  # six at once on a small machine: one thread each
    procs = {
        (how, n): subprocess.Popen(
            [sys.executable, "-c", code, how, str(tmp_path / f"{how}{n}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for how, n in runs
    }
    results = {}
    try:
        for (how, n), proc in procs.items():
            stdout, stderr = proc.communicate(timeout=240)
            assert proc.returncode == 0, stderr[-3000:]
            weights = float(next(line.split()[1] for line in stdout.splitlines() if line.startswith("WEIGHTS")))
            results[how, n] = weights, (tmp_path / f"{how}{n}" / "run" / "train.log").read_text()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_model_built_before_the_seed_is_noted_once_with_the_fix(tmp_path: Path) -> None:
    runs = _fresh_processes(tmp_path, [(how, n) for how in ("object", "dict", "seeded_first") for n in (1, 2)])
    (w1, log1), (w2, _) = runs["object", 1], runs["object", 2]
    assert w1 != w2  # the trap: same script, same seed, other initial weights
    assert log1.count("The model was built before the Trainer seeded torch with seed 3") == 1
    assert "tw.seed_everything(3)" in log1 and "model=dict(type=...)" in log1

    for how in ("dict", "seeded_first"):
        (a, log_a), (b, _) = runs[how, 1], runs[how, 2]
        assert a == b, how  # the fix: both runs start from the same weights
        assert "built before the Trainer seeded" not in log_a, how


# -- 15. quiet wrong answers ---------------------------------------------------------------
def test_a_failed_restore_is_not_skipped_by_the_next_run(tmp_path: Path) -> None:
    t = _trainer(tmp_path, load_from=str(tmp_path / "missing.pth"))
    initial = [p.detach().clone() for p in t.unwrapped_model.parameters()]
    for _ in range(2):  # before: the second train() trained the initial weights, load_from ignored
        with pytest.raises(FileNotFoundError, match="missing.pth"):
            t.train()
    assert all(torch.equal(a, b) for a, b in zip(initial, t.unwrapped_model.parameters()))
    t.close()


def test_resume_after_a_validation_pass_still_resumes(tmp_path: Path) -> None:
    val = dict(val_dataloader=DataLoader(regression_set(), batch_size=5), val_evaluator=MeanAbs())
    t = _trainer(tmp_path, default_hooks=dict(checkpoint=dict(interval=1)), **val)
    t.train()
    t.close()
    t = _trainer(
        tmp_path,
        resume=True,
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(checkpoint=dict(interval=1)),
        **val,
    )
    t.val()
    t.train()
    assert (
        t.checkpoints.restored is not None and t.checkpoints.restored[1] == 10
    )  # train() resumed from epoch_2 (iteration 10)
    assert t.progress.iteration == 15
    t.close()


class NanAt3(LinearReg):
    """A NaN loss at the third training step."""

    steps = 0

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = super().forward(x, y, mode)
        if mode == "loss":
            self.steps += 1
            if self.steps == 3:
                return {"loss": out["loss"] * float("nan")}
        return out


@pytest.mark.parametrize("clip", [None, dict(max_norm=1.0)])
def test_nan_advice_depends_on_whether_clipping_is_on(tmp_path: Path, clip: dict[str, float] | None) -> None:
    t = _trainer(tmp_path, model=NanAt3(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05), clip_grad=clip))
    with pytest.raises(FloatingPointError) as e:
        t.train()
    message = str(e.value)
    assert "at iteration 3" in message and "nonfinite_loss='skip'" in message
    if clip is None:
        assert "enable gradient clipping" in message
    else:
        assert "enable gradient clipping" not in message and "Gradient clipping is on already" in message
    t.close()


CONFIG = """
custom_imports = dict(imports=["reliability_cli_model"])
model = dict(type="CliTwoLayer")
train_dataloader = dict(dataset=dict(type="CliRegression"), batch_size=4)
val_dataloader = dict(dataset=dict(type="CliRegression"), batch_size=5)
val_evaluator = dict(type="CliMeanAbs")
optim_wrapper = dict(optimizer=dict(type="SGD", lr=0.05))
train_cfg = dict(by_epoch=True, max_epochs=2)
default_hooks = dict(checkpoint=dict(interval=1))
randomness = dict(seed=0)
"""

MODULE = """
import sys
sys.path.insert(0, {tests!r})
from conftest import regression_set
from test_silent_configs import MeanAbs, TwoLayer
from trainwright.registry import DATASETS, METRICS, MODELS
MODELS.register(TwoLayer, name="CliTwoLayer", force=True)
METRICS.register(MeanAbs, name="CliMeanAbs", force=True)
DATASETS.register(lambda: regression_set(), name="CliRegression", force=True)
"""


def test_cli_val_without_checkpoint_warns_and_plot_leaves_evaluations_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainwright.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reliability_cli_model.py").write_text(MODULE.format(tests=str(Path(__file__).parent)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    (tmp_path / "cfg.py").write_text(CONFIG)
    assert main(["train", "cfg.py", "--work-dir", "wd"]) == 0
    trained = load_records("wd")
    capsys.readouterr()

    assert main(["val", "cfg.py", "--work-dir", "wd"]) == 0
    out = capsys.readouterr().out
    assert "no --checkpoint and no load_from" in out and "initial (untrained) weights" in out
    val_run = max((p for p in Path("wd").iterdir() if p.name != "checkpoints"), key=lambda p: p.stat().st_mtime)
    assert "no --checkpoint" in (val_run / "train.log").read_text()

    assert main(["val", "cfg.py", "--work-dir", "wd", "--checkpoint", "wd/checkpoints/epoch_2.pth"]) == 0
    assert "no --checkpoint" not in capsys.readouterr().out

    # two evaluation-only run folders now sit beside the training run: the curves are the training run's alone
    assert load_records("wd") == trained
    assert not any(r["mode"] == "val" and r["iter"] == 0 for r in load_records("wd"))
    assert [r["mode"] for r in load_records(val_run)] == ["val"]  # an evaluation's own folder still plots
    assert main(["plot", "wd", "--keys", "val/mae", "--out", "curves.png"]) == 0


# -- 17. noise -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("hook_timing", "log_level", "table"),
    [(None, "INFO", False), (True, "INFO", True), (None, "DEBUG", True), (False, "DEBUG", False)],
)
def test_hook_timing_table_only_when_asked_or_at_debug(
    tmp_path: Path, hook_timing: bool | None, log_level: str, table: bool
) -> None:
    t = _trainer(tmp_path, hook_timing=hook_timing, log_level=log_level, experiment_name="run")
    t.train()
    t.flush_logs()
    assert ("Time spent in hooks" in (tmp_path / "run" / "train.log").read_text()) is table
    if hook_timing is not False:
        assert len(t.hooks.report()) > 0  # timed by default all the same
    t.close()


def test_metrics_jsonl_of_the_plot_test_is_json(tmp_path: Path) -> None:
    """Guard of the plot test's premise: a standalone validation writes a val record at iteration 0."""
    t = _trainer(
        tmp_path,
        val_dataloader=DataLoader(regression_set(), batch_size=5),
        val_evaluator=MeanAbs(),
        experiment_name="ev",
    )
    t.val()
    t.close()
    (rec,) = [json.loads(line) for line in (tmp_path / "ev" / "metrics.jsonl").read_text().splitlines()]
    assert rec["mode"] == "val" and rec["iter"] == 0
