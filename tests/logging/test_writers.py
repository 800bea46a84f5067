"""Writers: what Trainer(writers=...) builds, that every writer gets the records of metrics.jsonl, and that only rank
0 writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import classification_set
from torch import nn
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.evaluation.collect import DEFAULT_GROUP
from trainwright.logging import ConsoleWriter, JsonlWriter, LineInfo, Writer
from trainwright.strategies.single_device import SingleDeviceStrategy


class Clf(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        logits = self.linear(x)
        return {"loss": F.cross_entropy(logits, y)} if mode == "loss" else logits


class Collector(Writer):
    """Keeps every call; overrides everything but flush/close (base no-ops)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.lines: list[LineInfo] = []
        self.configs: list[dict[str, Any]] = []

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:
        assert len(records) == len(lines)
        self.records += records
        self.lines += lines

    def write_eval(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def write_config(self, config: dict[str, Any]) -> None:
        self.configs.append(config)


def _jsonl(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _clf_trainer(trainer_factory: Any, **kw: Any) -> tw.Trainer:
    ds = classification_set(24)
    return trainer_factory(
        model=Clf(),
        dataset=ds,
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        val_dataloader=DataLoader(ds, batch_size=8),
        val_evaluator=tw.evaluation.Accuracy(),
        default_hooks=dict(checkpoint=None, logger=dict(interval=4)),
        log_level="INFO",
        **kw,
    )


def test_a_writer_gets_the_same_records_as_metrics_jsonl(trainer_factory: Any) -> None:
    mine = Collector()
    t = _clf_trainer(trainer_factory, writers=[mine, "jsonl"])
    assert t.writers[0] is mine and isinstance(t.writers[1], JsonlWriter)
    t.train()
    t.val()
    t.flush_logs()
    lines = _jsonl(t.run_dir)
    # 6 iterations per epoch: lines at 4, 6 (epoch end), 10 (the epoch's 4th), 12, validation after each epoch and once
    # more
    assert [(r["mode"], r["iter"]) for r in lines] == [
        ("train", 4),
        ("train", 6),
        ("val", 6),
        ("train", 10),
        ("train", 12),
        ("val", 12),
        ("val", 12),
    ]
    assert mine.records == lines
    assert [(i.batch, i.epoch_len, i.by_epoch) for i in mine.lines] == [
        (4, 6, True),
        (6, 6, True),
        (4, 6, True),
        (6, 6, True),
    ]  # [2][4/6]: as mmengine
    assert len(mine.configs) <= 1
    assert mine.configs[0]["train_cfg"] == {"by_epoch": True, "max_epochs": 2} and mine.configs[0]["world_size"] == 1
    json.dumps(mine.configs[0])  # plain values only
    # The list replaced the defaults: no console writer, so no training lines in train.log.
    assert "Epoch(train)" not in (t.run_dir / "train.log").read_text()


def test_default_writers_are_console_and_jsonl(trainer_factory: Any) -> None:
    t = _clf_trainer(trainer_factory)
    assert [type(w) for w in t.writers] == [ConsoleWriter, JsonlWriter]
    t.train()
    t.flush_logs()
    log = (t.run_dir / "train.log").read_text()
    assert (
        sum("Epoch(train)" in ln for ln in log.splitlines())
        == sum(r["mode"] == "train" for r in _jsonl(t.run_dir))
        == 4
    )
    assert "Epoch(val) [2] iter 12  " in log


class RankOne(SingleDeviceStrategy):
    """A single-device strategy that claims to be rank 1 of a two-process job (the rank decision, without processes)."""

    @property
    def rank(self) -> int:
        return 1

    @property
    def world_size(self) -> int:
        return 2


def test_non_main_ranks_write_nothing(trainer_factory: Any) -> None:
    mine = Collector()
    t = _clf_trainer(trainer_factory, writers=[mine, "jsonl", "console"], strategy=RankOne(device="cpu"))
    assert not t.strategy.is_main_process and t.writers == []
    t.val_loop.evaluator.use_collectives(
        DEFAULT_GROUP
    )  # the fake rank has no peers to gather metrics from: this process's group
    t.train()
    t.val()
    t.flush_logs()
    assert mine.records == [] and mine.configs == []
    assert not (t.run_dir / "metrics.jsonl").exists() and not (t.run_dir / "train.log").exists()


def test_writer_spec_errors_name_the_fix(trainer_factory: Any) -> None:
    with pytest.raises(KeyError, match="Unknown writer 'jsnol'. Did you mean 'jsonl'"):
        trainer_factory(writers=["jsnol"])
    with pytest.raises(TypeError, match="writers must be a list"):
        trainer_factory(writers="jsonl")
    with pytest.raises(TypeError, match="subclass trainwright.logging.Writer"):
        trainer_factory(writers=[object()])


def test_a_writer_need_not_subclass_writer(trainer_factory: Any) -> None:
    """Any object with the five methods is a Writer (a protocol); subclassing only adds the no-op defaults."""

    class Duck:
        def __init__(self) -> None:
            self.n = 0

        def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:
            self.n += len(records)

        def write_eval(self, record: dict[str, Any]) -> None: ...
        def write_config(self, config: dict[str, Any]) -> None: ...
        def flush(self) -> None: ...
        def close(self) -> None: ...

    duck = Duck()
    t = trainer_factory(writers=[duck], default_hooks=dict(checkpoint=None, logger=dict(interval=5)))
    t.train()
    assert duck.n == 2  # 10 iterations, interval 5
