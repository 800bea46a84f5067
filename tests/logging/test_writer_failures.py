"""A writer that raises never costs a checkpoint (issue #27, item 9).

Before: the logger hook (priority BELOW_NORMAL) runs before the checkpoint hook (VERY_LOW) at
an epoch end and at the end of training, and nothing caught a writer's error, so a tracker
outage at the last epoch end ended the run without its last checkpoint. Now every record fans
out through ``trainer.writers`` (:class:`~trainwright.logging.Writers`): a failing writer is
reported once and disabled (``writers_fail="warn"``), or its error is raised after the
checkpoint due at that point (``"raise"``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.logging import LineInfo, Writer, WriterError


class Flaky(Writer):
    """Raises ConnectionError in ``method`` once it is handed a record with ``epoch == at`` (or any record when
    ``at`` is None)."""

    def __init__(self, method: str = "write_train", at: int | None = None) -> None:
        self.method, self.at = method, at
        self.calls: list[tuple[str, Any]] = []
        self.closed = False

    def _maybe_fail(self, method: str, records: list[dict[str, Any]]) -> None:
        self.calls.append((method, [(r["epoch"], r["iter"]) for r in records]))
        if method == self.method and any(self.at is None or r["epoch"] == self.at for r in records):
            raise ConnectionError("tracker down")

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:
        self._maybe_fail("write_train", records)

    def write_eval(self, record: dict[str, Any]) -> None:
        self._maybe_fail("write_eval", [record])

    def close(self) -> None:
        self.closed = True


def _trainer(tmp_path: Path, writer: Writer, **kw: Any) -> tw.Trainer:
    """3 epochs of 5 iterations, a line every 2 iterations (and at each epoch's end), a checkpoint every epoch."""
    args: dict[str, Any] = dict(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(regression_set(20), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(logger=dict(interval=2, flush_secs=0.0), checkpoint=dict(interval=1)),
        writers=["console", "jsonl", writer],
        randomness=dict(seed=0),
        experiment_name="run",
    )
    args.update(kw)
    return tw.Trainer(**args)


def _ckpts(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "checkpoints").glob("epoch_*.pth"))


def _jsonl(t: tw.Trainer) -> list[tuple[str, int]]:
    return [(r["mode"], r["iter"]) for r in map(json.loads, (t.run_dir / "metrics.jsonl").read_text().splitlines())]


def test_a_writer_raising_at_the_last_epoch_end_keeps_every_checkpoint(tmp_path: Path) -> None:
    flaky = Flaky(at=3)  # the epoch-3 lines are written at the last epoch's end (and the end of training)
    t = _trainer(tmp_path, flaky, default_hooks=dict(logger=dict(interval=100), checkpoint=dict(interval=1)))
    with t, pytest.warns(RuntimeWarning, match=r"Writer Flaky failed in write_train: ConnectionError: tracker down"):
        t.train()
    assert _ckpts(tmp_path) == ["epoch_1.pth", "epoch_2.pth", "epoch_3.pth"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "epoch_3.pth"
    log = (t.run_dir / "train.log").read_text()
    assert (
        log.count("Writer Flaky failed in write_train: ConnectionError: tracker down") == 1
    )  # reported once, in train.log
    assert "writers_fail='raise'" in log  # the message says how to stop the run instead
    assert _jsonl(t)[-1] == ("train", 15)  # the other writers got the record the failing one raised on
    assert flaky.closed  # a failed writer is still closed (its files released)


def test_a_failed_writer_is_disabled_and_later_records_reach_the_others(tmp_path: Path) -> None:
    flaky = Flaky(at=1)  # fails at the first line (iteration 2); training goes on
    t = _trainer(tmp_path, flaky)
    with t, pytest.warns(RuntimeWarning, match="Writer Flaky failed"):
        t.train()
    assert flaky.calls == [("write_train", [(1, 2)])]  # nothing more after the failure
    assert [it for mode, it in _jsonl(t)] == [2, 4, 5, 7, 9, 10, 12, 14, 15]  # every line reached metrics.jsonl
    assert _ckpts(tmp_path) == ["epoch_1.pth", "epoch_2.pth", "epoch_3.pth"]
    assert t.writers.failed[0][0] is flaky and isinstance(t.writers.failed[0][1], ConnectionError)


def test_writers_fail_raise_raises_after_the_due_checkpoint_is_written(tmp_path: Path) -> None:
    t = _trainer(
        tmp_path,
        Flaky(at=2),
        writers_fail="raise",
        default_hooks=dict(logger=dict(interval=100), checkpoint=dict(interval=1)),
    )
    with (
        t,
        pytest.warns(RuntimeWarning),
        pytest.raises(
            WriterError,
            match=r"Writer Flaky failed in write_train: ConnectionError: tracker down.*writers_fail='raise'",
        ) as e,
    ):
        t.train()
    assert isinstance(e.value.__cause__, ConnectionError)
    assert _ckpts(tmp_path) == [
        "epoch_1.pth",
        "epoch_2.pth",
    ]  # the epoch-2 checkpoint was written before the error went on
    assert t.progress.epoch == 2 and t.progress.iteration == 10  # and the run stopped there
    lines = (t.run_dir / "train.log").read_text().splitlines()
    assert "Stopped by WriterError at epoch 2, iteration 10: Writer Flaky failed" in lines[-1]


def test_writers_fail_raise_at_the_last_epoch_end_waits_for_the_last_checkpoint(tmp_path: Path) -> None:
    """No periodic save at epoch 3 (interval 2): the error at that epoch end waits for the final checkpoint
    (save_last)."""
    t = _trainer(
        tmp_path,
        Flaky(at=3),
        writers_fail="raise",
        default_hooks=dict(logger=dict(interval=100), checkpoint=dict(interval=2)),
    )
    with t, pytest.warns(RuntimeWarning), pytest.raises(WriterError):
        t.train()
    assert _ckpts(tmp_path) == ["epoch_2.pth", "epoch_3.pth"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "epoch_3.pth"


def test_writers_fail_raise_with_validation_due_waits_for_the_checkpoint_after_it(tmp_path: Path) -> None:
    """The epoch's checkpoint waits for its validation: a writer's error at the epoch end waits for both."""
    t = _trainer(
        tmp_path,
        Flaky(at=1),
        writers_fail="raise",
        val_dataloader=DataLoader(regression_set(8), batch_size=4),
        val_evaluator=_Mse(),
        default_hooks=dict(logger=dict(interval=100), checkpoint=dict(interval=1)),
    )
    with t, pytest.warns(RuntimeWarning), pytest.raises(WriterError):
        t.train()
    assert _ckpts(tmp_path) == ["epoch_1.pth"]
    assert tw.checkpoint.load_file(tmp_path / "checkpoints" / "epoch_1.pth")["message_hub"] is not None
    assert ("val", 5) in _jsonl(t)  # the validation ran (and was logged) before the run stopped


def test_writers_fail_raise_mid_epoch_raises_at_once_when_no_checkpoint_is_due(tmp_path: Path) -> None:
    flaky = Flaky(at=2)  # the first line of epoch 2: iteration 7 (its 2nd), mid-epoch; no checkpoint due there
    t = _trainer(tmp_path, flaky, writers_fail="raise")
    with t, pytest.warns(RuntimeWarning), pytest.raises(WriterError):
        t.train()
    assert t.progress.iteration == 7
    assert _ckpts(tmp_path) == ["epoch_1.pth"]


def test_writers_fail_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"writers_fail must be 'warn' .* or 'raise'.*got 'ignore'"):
        _trainer(tmp_path, Flaky(), writers_fail="ignore")
    assert not (tmp_path / "run").exists()  # refused before anything was created


def test_a_writer_raising_in_write_eval_keeps_the_checkpoint(tmp_path: Path) -> None:
    t = _trainer(
        tmp_path,
        Flaky("write_eval", at=3),
        val_dataloader=DataLoader(regression_set(8), batch_size=4),
        val_evaluator=_Mse(),
    )
    with t, pytest.warns(RuntimeWarning, match="Writer Flaky failed in write_eval"):
        t.train()
    assert _ckpts(tmp_path) == ["epoch_1.pth", "epoch_2.pth", "epoch_3.pth"]


class _Mse(tw.evaluation.Metric):
    def process(self, data_batch: Any, outputs: Any) -> None:
        x, y = data_batch
        self.results.append(float(((outputs - y) ** 2).mean()))

    def compute(self, results: list[float]) -> dict[str, float]:
        return {"mse": sum(results) / len(results)}


class _Schedule:
    """A SaveAhead written here: says whether a checkpoint save may still follow, as the test sets it."""

    def __init__(self) -> None:
        self.due = True
        self.asked = 0

    def save_may_follow(self) -> bool:
        self.asked += 1
        return self.due


def test_a_raised_writer_error_waits_while_the_save_ahead_says_a_checkpoint_may_follow() -> None:
    """``Writers(fail="raise", ahead=...)`` asks the question after a failure: the error is held while yes, raised
    once at the next call after no."""
    schedule = _Schedule()
    bad, good = Flaky("write_eval"), Flaky()
    writers = tw.logging.Writers([bad, good], fail="raise", ahead=tw.logging.AnyAhead([object(), schedule]))
    with pytest.warns(RuntimeWarning, match="Flaky failed in write_eval"):
        writers.write_eval({"mode": "val", "epoch": 1, "iter": 4, "acc": 1.0})  # held: a save may follow
    assert schedule.asked == 1
    writers.flush()  # still held
    schedule.due = False
    with pytest.raises(WriterError, match="writers_fail='raise'") as caught:
        writers.flush()
    assert caught.value.writer is bad
    writers.flush()  # raised once only
    assert good.calls == [("write_eval", [(1, 4)])]  # the other writer was served
