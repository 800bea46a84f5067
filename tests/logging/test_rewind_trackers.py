"""A resumed run continues the same W&B run (offline) and the same MLflow run (its local SQLite store): one run, one
curve.

Run ``a`` logs every iteration up to 13 and stops (its checkpoints: 5 and 10); run ``b``, a new
trainer in a new run folder of the same work dir, resumes from iteration 10 to 20. Read back as a
user does: the W&B offline run folders (named after the run id), MLflow's client.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw


class StopAt(tw.Hook):
    def __init__(self, at: int) -> None:
        self.at = at

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        if trainer.progress.iteration == self.at:
            trainer.train_loop.control.request_stop(f"stopped at iteration {self.at}")


def _train(work: Path, name: str, writers: list[Any], **kw: Any) -> tw.Trainer:
    t = tw.Trainer(
        model=LinearReg(),
        work_dir=work,
        train_dataloader=DataLoader(regression_set(40), batch_size=4, shuffle=True),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05)),
        train_cfg=dict(by_epoch=False, max_iters=20),
        default_hooks=dict(checkpoint=dict(interval=5, by_epoch=False), logger=dict(interval=1, flush_secs=0)),
        randomness=dict(seed=0),
        log_level="WARNING",
        experiment_name=name,
        writers=["jsonl", *writers],
        **kw,
    )
    t.train()
    t.close()
    return t


@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning:mlflow.*", "ignore:.*noload.*loader strategy is deprecated"
)  # inside mlflow's own sqlalchemy store
@pytest.mark.slow
def test_a_resumed_run_continues_the_same_wandb_and_mlflow_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    writers = [dict(type="wandb", project="trainwright-test"), "mlflow"]  # MLflow: the SQLite store in the run folder
    work = tmp_path / "work"
    _train(work, "a", writers, custom_hooks=[StopAt(13)])
    _train(work, "b", writers, resume=str(work / "checkpoints" / "iter_10.pth"))

    # W&B: the offline run folders of both run folders are named after one run id
    ids = {p.name.rsplit("-", 1)[1] for p in work.glob("*/wandb/offline-run-*")}
    folders = {p.parent.parent.name for p in work.glob("*/wandb/offline-run-*")}
    assert folders == {"a", "b"} and len(ids) == 1, (folders, ids)

    # MLflow: b went on in a's store (b's folder keeps the run's id, no store); one run, finished, whose loss history
    # has every iteration, each value that of metrics.jsonl
    assert not (work / "b" / "mlflow" / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'a' / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("trainwright").experiment_id])
    assert run.info.status == "FINISHED"
    logged = {
        r["iter"]: r["loss"]
        for d in ("a", "b")
        for r in map(json.loads, (work / d / "metrics.jsonl").read_text().splitlines())
        if r["mode"] == "train"
    }
    assert sorted(logged) == list(range(1, 21))  # metrics.jsonl of a was cut back to 10
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert {m.step for m in history} == set(range(1, 21))
    # 11-13 were logged by a and again by b: the same numbers (the resume is exact), so the curve is one line
    assert all(m.value == logged[m.step] for m in history)
