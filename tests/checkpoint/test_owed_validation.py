"""A stop at an epoch's last batch (a run-control stop, a preemption signal) comes before that epoch's validation: the
checkpoint records it as owed, and the resumed run validates first, as the uninterrupted run did."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import chaos_train as ct
import torch
from test_preemption import SendSignal

import trainwright as tw
from trainwright.checkpoint import read_latest

EPOCH = 15  # chaos_train: 150 samples in batches of 10


class StopAt(tw.Hook):
    """Requests a stop through the run control after iteration ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        if trainer.progress.iteration == self.at:
            trainer.train_loop.control.request_stop(f"test: stop at {self.at}")


def _val_records(trainer: tw.Trainer) -> list[dict[str, Any]]:
    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["mode"] == "val"]


def _drop_time(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if "time" not in k} for r in records]


CKPT = dict(interval=4, by_epoch=False, max_keep_ckpts=2, save_best="val/acc", max_keep_best=2)


def _build(work_dir: Path, experiment: str, hooks: list[tw.Hook] | None = None, **kw: Any) -> tw.Trainer:
    return ct.build(str(work_dir), epochs=2, experiment=experiment, hooks=hooks, **kw)


def test_a_stop_at_an_epochs_last_batch_validates_that_epoch_on_resume(tmp_path: Path) -> None:
    ref = _build(tmp_path / "ref", "ref")
    ref.train()
    expected = _drop_time(_val_records(ref))
    assert [r["epoch"] for r in expected] == [1, 2], expected
    best = sorted(p.name for p in (tmp_path / "ref" / "checkpoints").glob("best_*"))
    assert best, "the reference run saved no best checkpoint"

    preempted = dict(preemption=dict(exit_code=None), logger=dict(interval=2), checkpoint=CKPT)
    stops: dict[str, dict[str, Any]] = {
        "request_stop": dict(hooks=[StopAt(EPOCH)]),
        "preemption": dict(hooks=[SendSignal(at=EPOCH, sig=signal.SIGTERM)], default_hooks=preempted),
    }
    for name, how in stops.items():
        ckpts = tmp_path / name / "checkpoints"
        stopped = _build(tmp_path / name, "a", **how)
        stopped.train()
        assert stopped.progress.iteration == EPOCH and _val_records(stopped) == [], name  # its validation not run
        saved = torch.load(ckpts / str(read_latest(ckpts)), weights_only=True)
        assert saved["progress"] == {"epoch": 1, "iteration": EPOCH, "iter_in_epoch": 0, "val_owed": True}, name

        resumed = _build(tmp_path / name, "b")
        resumed.train()
        assert _drop_time(_val_records(resumed)) == expected, name  # epoch 1's validation first, then epoch 2's
        assert sorted(p.name for p in ckpts.glob("best_*")) == best, name
        for k, v in ref.unwrapped_model.state_dict().items():
            assert torch.equal(v, resumed.unwrapped_model.state_dict()[k]), (name, k)


def test_an_iteration_based_run_stopped_at_a_validation_iteration_validates_it_on_resume(tmp_path: Path) -> None:
    loop = dict(
        train_cfg=dict(by_epoch=False, max_iters=20, val_interval=10),
        param_scheduler=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=20)],
    )
    ref = _build(tmp_path / "ref", "ref", **loop)
    ref.train()
    expected = _drop_time(_val_records(ref))
    assert [r["iter"] for r in expected] == [10, 20], expected

    stopped = _build(tmp_path / "w", "a", hooks=[StopAt(10)], **loop)
    stopped.train()
    assert _val_records(stopped) == []
    resumed = _build(tmp_path / "w", "b", **loop)
    resumed.train()
    assert _drop_time(_val_records(resumed)) == expected
