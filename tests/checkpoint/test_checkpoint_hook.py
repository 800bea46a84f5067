"""CheckpointHook: intervals, keep-last-k, best-k, the latest pointer, stale temp files, save order."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import chaos_train as ct
import pytest
import torch

import trainwright as tw
from trainwright.checkpoint import read_latest
from trainwright.hooks.checkpoint import CheckpointHook
from trainwright.hooks.hook import Hook


def _names(work: Path) -> set[str]:
    return {p.name for p in (work / "checkpoints").iterdir()}


class Events(Hook):
    """Records the checkpoint directory listing after every training iteration and validation."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.seen: list[tuple[int, set[str]]] = []

    def after_train_iter(
        self, trainer: tw.Trainer, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        trainer.strategy.wait_for_checkpoint()  # keep-k deletes an older file once the new one is durable
        d = trainer.checkpoints.ckpt_dir
        self.seen.append((trainer.progress.iteration, {p.name for p in d.iterdir()} if d.is_dir() else set()))


def test_iteration_interval_keeps_last_k_and_points_latest(tmp_path: Path) -> None:
    ev = Events()
    t = ct.build(
        str(tmp_path), checkpoint=dict(interval=5, by_epoch=False, max_keep_ckpts=2, save_best=None), hooks=[ev]
    )
    t.train()
    for it, names in ev.seen:
        periodic = sorted(n for n in names if n.startswith("iter_"))
        expected = [f"iter_{k}.pth" for k in range(5, it + 1, 5)][-2:]
        assert periodic == sorted(expected), (it, periodic)
    assert _names(tmp_path) == {"iter_40.pth", "iter_45.pth", "latest"}
    assert read_latest(tmp_path / "checkpoints") == "iter_45.pth"


def test_epoch_interval_and_last(tmp_path: Path) -> None:
    t = ct.build(str(tmp_path), epochs=3, checkpoint=dict(interval=2, by_epoch=True, max_keep_ckpts=-1, save_best=None))
    t.train()
    assert _names(tmp_path) == {"epoch_2.pth", "epoch_3.pth", "latest"}  # epoch_3: save_last
    assert read_latest(tmp_path / "checkpoints") == "epoch_3.pth"
    ckpt = torch.load(tmp_path / "checkpoints" / "epoch_2.pth", weights_only=True)
    assert ckpt["progress"] == {"epoch": 2, "iteration": 30, "iter_in_epoch": 0}


def test_interval_minus_one_saves_only_the_last_as_mmengines_default(tmp_path: Path) -> None:
    t = ct.build(str(tmp_path), epochs=3, checkpoint=dict(interval=-1, save_best=None))
    t.train()
    assert _names(tmp_path) == {"epoch_3.pth", "latest"}


def test_save_last_false_writes_no_final_checkpoint(tmp_path: Path) -> None:
    t = ct.build(
        str(tmp_path),
        epochs=1,
        checkpoint=dict(interval=4, by_epoch=False, save_last=False, save_best=None, max_keep_ckpts=-1),
    )
    t.train()
    assert _names(tmp_path) == {"iter_4.pth", "iter_8.pth", "iter_12.pth", "latest"}


def test_epoch_checkpoint_is_written_after_that_epochs_validation(tmp_path: Path) -> None:
    t = ct.build(str(tmp_path), epochs=2, checkpoint=dict(interval=1, by_epoch=True, save_best="val/acc"))
    t.train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val1 = next(r for r in records if r["mode"] == "val" and r["epoch"] == 1)
    hook_state = torch.load(tmp_path / "checkpoints" / "epoch_1.pth", weights_only=True)["hooks"]["CheckpointHook"]
    assert hook_state["best"][0][0] == pytest.approx(val1["val/acc"])  # the best score includes epoch 1's validation


def test_save_best_with_mmengines_metric_name_finds_the_prefixed_key(tmp_path: Path) -> None:
    """mmengine configs name the evaluator's key (``save_best='acc'``, mmseg's ``'mIoU'``): found as ``val/acc``, as
    EarlyStoppingHook finds it."""
    t = ct.build(str(tmp_path), epochs=2, checkpoint=dict(interval=1, by_epoch=True, save_best="acc"))
    t.train()
    best = [n for n in _names(tmp_path) if n.startswith("best_")]
    assert best and all(n.startswith("best_val_acc_epoch_") for n in best)


class FakeScores(Hook):
    """Replaces validation metrics with a scripted sequence (the score is what the test controls)."""

    priority = "HIGHEST"

    def __init__(self, scores: list[float]) -> None:
        self.scores = scores
        self.i = 0

    def after_val_epoch(self, trainer: tw.Trainer, metrics: dict[str, float] | None = None) -> None:
        assert metrics is not None
        metrics["val/acc"] = self.scores[self.i]
        self.i += 1


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("greater", {"best_val_acc_epoch_2.pth", "best_val_acc_epoch_4.pth"}),
        ("less", {"best_val_acc_epoch_1.pth", "best_val_acc_epoch_3.pth"}),
    ],
)
def test_best_k_by_rule(tmp_path: Path, rule: str, expected: set[str]) -> None:
    scores = [0.5, 0.9, 0.1, 0.95, 0.7]
    t = ct.build(
        str(tmp_path),
        epochs=5,
        hooks=[FakeScores(scores)],
        checkpoint=dict(interval=-1, save_last=False, save_best="val/acc", rule=rule, max_keep_best=2),
    )
    t.train()
    best = {n for n in _names(tmp_path) if n.startswith("best_")}
    assert best == expected
    hook = t.hooks.get(CheckpointHook)
    assert hook.best_score == (0.95 if rule == "greater" else 0.1)
    for name in best:  # each best file holds the state after its epoch
        n = int(name.split("_")[-1].split(".")[0])
        assert torch.load(tmp_path / "checkpoints" / name, weights_only=True)["progress"]["epoch"] == n


def test_stale_temp_files_of_dead_writers_are_removed_at_start(tmp_path: Path) -> None:
    d = tmp_path / "checkpoints"
    d.mkdir(parents=True)
    # a pid that cannot be alive: beyond the kernel's pid_max
    dead = (
        int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
        if Path("/proc/sys/kernel/pid_max").exists()
        else 2**22 + 1
    )
    stale = d / f".iter_4.pth.tmp.{dead}.deadbeef"
    stale.write_bytes(b"partial")
    alive = d / f".iter_4.pth.tmp.{os.getppid()}.cafe0123"  # a live process: may still be writing
    alive.write_bytes(b"partial")
    other = d / "notes.txt"
    other.write_text("keep me")
    t = ct.build(str(tmp_path), epochs=1, checkpoint=dict(interval=-1, save_best=None))
    t.train()
    assert not stale.exists()
    assert alive.exists() and other.exists()


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="rule"):
        CheckpointHook(rule="bigger")
    with pytest.raises(ValueError, match="max_keep_ckpts=0"):
        CheckpointHook(max_keep_ckpts=0)
    with pytest.raises(ValueError, match="max_keep_best"):
        CheckpointHook(max_keep_best=0)


def test_validation_does_not_move_the_training_random_stream(tmp_path: Path) -> None:
    """Training with validation every epoch draws the same random numbers as without it."""
    runs = []
    for i, val in enumerate((True, False)):
        extra: dict[str, Any] = {} if val else dict(val_dataloader=None, val_evaluator=None)
        t = ct.build(str(tmp_path / str(i)), epochs=2, checkpoint=dict(interval=-1, save_best=None), **extra)
        t.train()
        runs.append(t.unwrapped_model.state_dict())
    for k in runs[0]:
        assert torch.equal(runs[0][k], runs[1][k]), k


@pytest.mark.parametrize(
    ("checkpoint", "saved", "warned"),
    [
        (None, ["iter_3.pth", "iter_6.pth"], False),  # the default hook follows the loop: every val_interval iterations
        (
            dict(interval=2),
            ["iter_2.pth", "iter_4.pth", "iter_6.pth"],
            False,
        ),  # a user interval without by_epoch: iterations too
        (
            dict(by_epoch=True, interval=1),
            ["iter_6.pth"],
            True,
        ),  # an explicit by_epoch=True is kept: the log says only the last is saved
    ],
)
def test_checkpoint_hook_follows_an_iteration_based_loop_unless_told(
    tmp_path: Path, checkpoint: dict | None, saved: list[str], warned: bool
) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    class Reg(tw.BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
            out = self.lin(x)
            return {"loss": torch.nn.functional.mse_loss(out, y)} if mode == "loss" else out

    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = tw.Trainer(
        model=Reg(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(data, batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=6, val_interval=3),
        default_hooks=None if checkpoint is None else dict(checkpoint=checkpoint),
    )
    trainer.train()
    trainer.close()
    log = next(tmp_path.glob("*/train.log")).read_text()
    assert (
        "CheckpointHook counts its interval in epochs (by_epoch=True) but training is iteration-based" in log
    ) is warned
    assert ("WARNING" in log) is warned, log
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pth")) == saved


def test_a_save_before_train_is_named_and_recorded_as_one_during_training(tmp_path: Path) -> None:
    """The manager's names (epoch names of an epoch-based loop) and the hook's record are given when the Trainer is
    built: a ``save_now()`` before ``train()`` is an epoch checkpoint that keep-k counts, as the run's own."""
    from conftest import make_trainer

    t = make_trainer(
        tmp_path,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        default_hooks=dict(checkpoint=dict(interval=1, max_keep_ckpts=2)),
    )
    hook = next(h for h in t.hooks if isinstance(h, CheckpointHook))
    t.build_train_loop()  # what train() builds first (the prepared model)
    assert t.checkpoints.save_now() == tmp_path / "checkpoints" / "epoch_0.pth"  # epoch 0's end, before train()
    assert hook.kept == ["epoch_0.pth"] and hook.state_dict()["last_saved_iter"] == 0
    t.train()
    t.close()
    assert hook.kept == ["epoch_1.pth", "epoch_2.pth"]
    assert _names(tmp_path) == {"epoch_1.pth", "epoch_2.pth", "latest"}  # keep-2 dropped the first as any other


def test_early_stopping_asks_the_run_control_and_the_last_checkpoint_is_written(tmp_path: Path) -> None:
    """EarlyStoppingHook(patience=1): the second validation is worse, training ends after epoch 2 through the loop's
    run control (its reason kept), and save_last writes that epoch."""
    from trainwright.hooks.early_stopping import EarlyStoppingHook

    t = ct.build(
        str(tmp_path),
        epochs=5,
        checkpoint=dict(interval=10, by_epoch=True, save_best=None, save_last=True),
        hooks=[FakeScores([0.5, 0.4, 0.9, 0.9, 0.9]), EarlyStoppingHook("val/acc", patience=1)],
    )
    t.train()
    assert t.progress.epoch == 2 and t.train_loop is not None
    assert (t.train_loop.control.stop_reason or "").startswith("early stopping: val/acc did not improve")
    assert _names(tmp_path) == {"epoch_2.pth", "latest"}
