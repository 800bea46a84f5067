"""``MlflowWriter``: an MLflow run, by default in a local SQLite store inside the run folder."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from trainwright.logging.writers import LineInfo, Writer, import_backend, scalars

_BAD_KEY = re.compile(r"[^\w\-. /]")  # MLflow keys: alphanumerics, _ - . space /
_MAX_PARAM = 6000  # longest param value every MLflow version accepts
_BATCH = 1000  # metrics per log_batch call (MLflow's limit)


class MlflowWriter(Writer):
    """Logs to an MLflow run through ``MlflowClient`` (no global active run is touched).

    Training values go in as ``train/<key>``, evaluation metrics under their keys
    (``val/acc``), each with the iteration as the step and the log line's time as the
    timestamp; the resolved config becomes the run's params (nested keys joined with ``.``,
    values longer than 6000 characters cut). Characters MLflow refuses in a key become
    ``_``. The run is ended by :meth:`close` (status ``FINISHED``).

    By default everything stays in the run folder: the store is ``sqlite:///<dir>/mlflow.db``
    and artifacts go to ``<dir>/artifacts``; read it with ``mlflow ui --backend-store-uri
    sqlite:///<dir>/mlflow.db`` or ``MlflowClient(tracking_uri=...)``. Needs
    ``pip install 'trainwright[mlflow]'``.

    Args:
        dir: Folder of the default store (``Trainer(writers=["mlflow"])``: ``<run folder>/mlflow``).
        tracking_uri: Another store (``"sqlite:///path/mlflow.db"``, ``"http://host:5000"``);
            None: the SQLite file in ``dir``.
        experiment_name: MLflow experiment, created if it does not exist.
        run_name: Name of the MLflow run; None: the name of the trainer's run folder.
        tags: Tags set on the run.
    """

    def __init__(
        self,
        dir: str | Path,
        tracking_uri: str | None = None,
        experiment_name: str = "trainwright",
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        tracking = import_backend("mlflow.tracking", "mlflow", "mlflow")
        self.dir = Path(dir).absolute()
        artifacts: str | None = None
        if tracking_uri is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            tracking_uri = f"sqlite:///{self.dir / 'mlflow.db'}"
            artifacts = (self.dir / "artifacts").as_uri()
        self.tracking_uri = tracking_uri
        self.client: Any = tracking.MlflowClient(tracking_uri=tracking_uri)
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(experiment_name, artifact_location=artifacts)
        )
        run = self.client.create_run(experiment_id, run_name=run_name or self.dir.parent.name, tags=tags or {})
        self.run_id: str = run.info.run_id
        self._entities = import_backend("mlflow.entities", "mlflow", "mlflow")
        self._closed = False

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:  # noqa: D102
        metric = self._entities.Metric
        self._log(
            [
                metric(_key(f"train/{k}"), v, int(info.created * 1000), rec["iter"])
                for rec, info in zip(records, lines)
                for k, v in scalars(rec)
            ]
        )

    def write_eval(self, record: dict[str, Any]) -> None:  # noqa: D102
        metric = self._entities.Metric
        now = int(time.time() * 1000)
        self._log(
            [
                metric(_key(k if "/" in k else f"{record['mode']}/{k}"), v, now, record["iter"])
                for k, v in scalars(record)
            ]
        )

    def write_config(self, config: dict[str, Any]) -> None:  # noqa: D102
        param = self._entities.Param
        params = [param(_key(k)[:250], v[:_MAX_PARAM]) for k, v in _flatten(config)]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per call
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def close(self) -> None:  # noqa: D102
        if not self._closed:
            self._closed = True
            self.client.set_terminated(self.run_id)

    def _log(self, metrics: list[Any]) -> None:
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + _BATCH])


def _key(key: str) -> str:
    return _BAD_KEY.sub("_", key)


def _flatten(obj: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as ``("a.b.c", "value")`` pairs; lists and leaves as their text."""
    if isinstance(obj, dict):
        if not obj and prefix:
            return [(prefix, "{}")]
        return [pair for k, v in obj.items() for pair in _flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    return [(prefix or "value", str(obj))]
