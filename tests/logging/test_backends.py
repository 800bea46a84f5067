"""Writer backends as a user reads them back: CSV, TensorBoard events, a W&B offline run, an MLflow store.

Each backend's numbers are compared with ``metrics.jsonl`` of the same run (the reference
record of every logged number), read back with the backend's own reader.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import classification_set
from torch import nn
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.logging import build_writers
from trainwright.logging.csv_writer import CsvWriter

META = ("mode", "epoch", "iter")


class Clf(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        logits = self.linear(x)
        return {"loss": F.cross_entropy(logits, y)} if mode == "loss" else logits


def _run(trainer_factory: Any, writers: list[Any], **kw: Any) -> tw.Trainer:
    """50 iterations, a line every 20 (and the last, short interval at 50), validation at 25 and 50."""
    ds = classification_set(40)
    kw.setdefault("train_cfg", dict(by_epoch=False, max_iters=50, val_interval=25))
    t = trainer_factory(
        model=Clf(),
        dataset=ds,
        batch_size=4,
        val_dataloader=DataLoader(ds, batch_size=8),
        val_evaluator=tw.evaluation.Accuracy(),
        default_hooks=dict(checkpoint=None, logger=dict(interval=20)),
        log_level="INFO",
        writers=["console", "jsonl", *writers],
        **kw,
    )
    t.train()
    t.flush_logs()
    return t


def _jsonl(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_csv_rows_equal_the_jsonl_records(trainer_factory: Any) -> None:
    t = _run(trainer_factory, ["csv"])
    ref = _jsonl(t.run_dir)
    for mode in ("train", "val"):
        with open(t.run_dir / "csv" / f"{mode}.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        expected = [r for r in ref if r["mode"] == mode]
        assert len(rows) == len(expected) > 0
        for row, rec in zip(rows, expected):
            got = {k: v for k, v in row.items() if v != ""}
            assert got.keys() == {k for k in rec}, (row, rec)
            assert got["mode"] == mode and int(got["iter"]) == rec["iter"] and int(got["epoch"]) == rec["epoch"]
            assert {k: float(v) for k, v in got.items() if k not in META} == {
                k: v for k, v in rec.items() if k not in META
            }  # exact: repr round-trips
    assert [r["iter"] for r in ref if r["mode"] == "train"] == [20, 40, 50]


def test_csv_widens_its_header_when_a_key_appears(tmp_path: Path) -> None:
    w = CsvWriter(tmp_path / "csv")
    w.write_eval({"mode": "val", "epoch": 1, "iter": 10, "val/acc": 0.5})
    w.write_eval({"mode": "val", "epoch": 2, "iter": 20, "val/acc": 0.75, "val/f1": float("nan")})
    w.close()
    w2 = CsvWriter(tmp_path / "csv")  # a second writer appends under the same header
    w2.write_eval({"mode": "val", "epoch": 3, "iter": 30, "val/f1": 0.25, "val/acc": 1.0})
    w2.close()
    with open(tmp_path / "csv" / "val.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["mode", "epoch", "iter", "val/acc", "val/f1"]
    assert [r["val/acc"] for r in rows] == ["0.5", "0.75", "1.0"]
    assert rows[0]["val/f1"] == "" and math.isnan(float(rows[1]["val/f1"])) and rows[2]["val/f1"] == "0.25"


def test_tensorboard_events_equal_the_jsonl_records(trainer_factory: Any) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = _run(trainer_factory, [dict(type="tensorboard", flush_secs=1)])
    t.close()
    acc = EventAccumulator(str(t.run_dir / "tensorboard"))
    acc.Reload()
    ref = _jsonl(t.run_dir)
    train = [r for r in ref if r["mode"] == "train"]
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [20, 40, 50]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in train], rel=1e-6)  # event files hold float32
    assert [e.value for e in acc.Scalars("train/lr")] == pytest.approx([r["lr"] for r in train], rel=1e-6)
    val = [r for r in ref if r["mode"] == "val"]
    assert [(e.step, e.value) for e in acc.Scalars("val/acc")] == [
        (r["iter"], pytest.approx(r["val/acc"], rel=1e-6)) for r in val
    ]
    (config,) = acc.Tensors("config/text_summary")  # the resolved config, as a text summary
    assert b'"max_iters": 50' in config.tensor_proto.string_val[0]


@pytest.mark.slow
def test_wandb_offline_run_lands_in_the_run_folder(
    trainer_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    t = _run(trainer_factory, [dict(type="wandb", project="trainwright-test")])
    run = t.writers[-1].run
    ref = _jsonl(t.run_dir)
    last_train = [r for r in ref if r["mode"] == "train"][-1]
    last_val = [r for r in ref if r["mode"] == "val"][-1]
    assert run.summary["train/loss"] == pytest.approx(last_train["loss"], rel=1e-12)
    assert run.summary["val/acc"] == pytest.approx(last_val["val/acc"], rel=1e-12)
    assert run.config["train_cfg"]["max_iters"] == 50
    assert run.name == t.run_dir.name
    t.close()
    runs = list((t.run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    logs = list(runs[0].glob("run-*.wandb"))
    assert len(logs) == 1
    # W&B's own service process writes the transaction log; finish() may return before its last write lands.
    deadline = time.monotonic() + 60
    while (
        not (b"train/loss" in logs[0].read_bytes() and b"val/acc" in logs[0].read_bytes())
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert b"train/loss" in logs[0].read_bytes() and b"val/acc" in logs[0].read_bytes()


@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning:mlflow.*", "ignore:.*noload.*loader strategy is deprecated"
)  # inside mlflow's own sqlalchemy store
@pytest.mark.slow
def test_mlflow_metrics_query_back_through_the_client(trainer_factory: Any) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    t = _run(trainer_factory, ["mlflow"])
    t.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{t.run_dir / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("trainwright")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == t.run_dir.name
    ref = _jsonl(t.run_dir)
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(r["iter"], r["loss"]) for r in ref if r["mode"] == "train"]
    val = client.get_metric_history(run.info.run_id, "val/acc")
    assert [(m.step, m.value) for m in val] == [(r["iter"], r["val/acc"]) for r in ref if r["mode"] == "val"]
    assert run.data.params["train_cfg.max_iters"] == "50"


def test_writers_by_name_dict_and_config_key(trainer_factory: Any, tmp_path: Path) -> None:
    t = trainer_factory(writers=["jsonl", dict(type="csv")])
    assert [type(w).__name__ for w in t.writers] == ["JsonlWriter", "CsvWriter"]
    with pytest.raises(TypeError, match=r"Unknown writer 'csv' key 'flush'.*Its arguments: \[\]"):
        trainer_factory(writers=[dict(type="csv", flush=1)])
    with pytest.raises(KeyError, match="Did you mean 'tensorboard'"):
        trainer_factory(writers=["tensorbord"])
    with pytest.raises(TypeError, match="needs a 'type'"):
        trainer_factory(writers=[dict(flush_secs=1)])
    cfg = dict(
        model=dict(type="LinearRegFromConfig"),
        work_dir=str(tmp_path / "cfg"),
        writers=["jsonl", "csv"],
        train_dataloader=dict(dataset=dict(type="RegressionSetFromConfig"), batch_size=2),
        train_cfg=dict(by_epoch=False, max_iters=3),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        default_hooks=dict(checkpoint=None, logger=dict(interval=2)),
        log_level="WARNING",
    )
    _register_config_parts()
    with tw.Trainer.from_config(cfg) as t2:
        t2.train()
        t2.flush_logs()
        with open(t2.run_dir / "csv" / "train.csv", newline="") as f:
            assert [int(r["iter"]) for r in csv.DictReader(f)] == [2, 3]


def _register_config_parts() -> None:
    from conftest import LinearReg, regression_set

    from trainwright.registry import DATASETS, MODELS

    if "LinearRegFromConfig" not in MODELS:
        MODELS.register(type("LinearRegFromConfig", (LinearReg,), {}))
    if "RegressionSetFromConfig" not in DATASETS:
        DATASETS.register(lambda: regression_set(8), name="RegressionSetFromConfig")


@pytest.mark.parametrize(
    ("name", "module", "extra"),
    [
        ("tensorboard", "tensorboard", "tensorboard"),
        ("wandb", "wandb", "wandb"),
        ("mlflow", "mlflow.tracking", "mlflow"),
    ],
)
def test_a_missing_backend_fails_at_construction_with_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, module: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import of it raises ImportError, as when not installed
    import logging

    with pytest.raises(ImportError, match=rf"pip install 'trainwright\[{extra}\]'"):
        build_writers([name], tmp_path, logging.getLogger("test"))
