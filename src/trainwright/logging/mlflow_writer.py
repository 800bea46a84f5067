"""``MlflowWriter``: an MLflow run, by default in a local SQLite store inside the run folder."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from trainwright.logging.resume import Resumed, newest, replace_text
from trainwright.logging.writers import LineInfo, Writer, import_backend, scalars

#: The file in the writer's folder that keeps the run's id and store for a resumed run.
RUN_FILE = "run.json"

_BAD_KEY = re.compile(r"[^\w\-. /]")  # MLflow keys: alphanumerics, _ - . space /
_MAX_PARAM = 6000  # longest param value every MLflow version accepts
_BATCH = 1000  # metrics per log_batch call (MLflow's limit)


class MlflowWriter(Writer):
    """Logs to an MLflow run through ``MlflowClient`` (no global active run is touched).

    Training values go in as ``train/<key>``, evaluation metrics under their keys
    (``val/acc``), each with the iteration as the step and the log line's time as the
    timestamp; the resolved config becomes the run's params (nested keys joined with ``.``,
    values longer than 6000 characters cut). Characters MLflow refuses in a key become
    ``_``. The run is created at the first record (its id and store kept in ``<dir>/run.json``) and ended by
    :meth:`close` (status ``FINISHED``). A resumed trainer (:meth:`resume`) continues the MLflow run of the run it
    resumes (in that run's store when no ``tracking_uri`` is given): one run, one curve.

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
        self._tracking = import_backend("mlflow.tracking", "mlflow", "mlflow")
        self.dir = Path(dir).absolute()
        self._default_store = tracking_uri is None
        #: The store (the SQLite file in ``dir`` unless given; after :meth:`resume`, the store of the run it continues).
        self.tracking_uri = f"sqlite:///{self.dir / 'mlflow.db'}" if tracking_uri is None else tracking_uri
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._tags = tags or {}
        self._run_id: str | None = None
        self._resumed = False
        self._config: dict[str, Any] | None = None
        self.client: Any = None
        self._entities = import_backend("mlflow.entities", "mlflow", "mlflow")
        self._closed = False

    @property
    def run_id(self) -> str:
        """The MLflow run's id (the run is created, or continued, on first use)."""
        if self.client is None:
            self._start()
        assert self._run_id is not None
        return self._run_id

    def resume(self, at: Resumed) -> None:
        """Continue the MLflow run that the newest earlier run folder (or this one) kept, when it lives in this
        writer's store (or no store was given: then in that run's store)."""
        found = newest(at.places(self.dir / RUN_FILE))
        if found is None or self.client is not None:
            return
        kept = json.loads(found.read_text(encoding="utf-8"))
        if isinstance(kept.get("run_id"), str) and (
            self._default_store or kept.get("tracking_uri") == self.tracking_uri
        ):
            self.tracking_uri = str(kept["tracking_uri"])
            self._run_id = kept["run_id"]
            self._resumed = True

    def _start(self) -> None:
        """Open the store and create the run, or set the continued run running again; keep its id in ``dir``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.client = self._tracking.MlflowClient(tracking_uri=self.tracking_uri)
        if self._resumed and self._run_id is not None:
            self.client.update_run(self._run_id, status="RUNNING")
        else:
            artifacts = (self.dir / "artifacts").as_uri() if self._default_store else None
            experiment = self.client.get_experiment_by_name(self._experiment_name)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self.client.create_experiment(self._experiment_name, artifact_location=artifacts)
            )
            run = self.client.create_run(
                experiment_id, run_name=self._run_name or self.dir.parent.name, tags=self._tags
            )
            self._run_id = run.info.run_id
        replace_text(
            self.dir / RUN_FILE, json.dumps({"run_id": self._run_id, "tracking_uri": self.tracking_uri}) + "\n"
        )
        self._log_params()

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
        self._config = config
        if self.client is not None:
            self._log_params()

    def _log_params(self) -> None:
        """The config as params; a continued run keeps the values it has (MLflow refuses to change a param)."""
        if self._config is None:
            return
        run_id = self.run_id
        have = self.client.get_run(run_id).data.params if self._resumed else {}
        param = self._entities.Param
        params = [param(k, v) for k, v in ((_key(k)[:250], v[:_MAX_PARAM]) for k, v in _flatten(self._config))]
        params = [p for p in params if p.key not in have]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per call
            self.client.log_batch(run_id, params=params[i : i + 100])

    def close(self) -> None:  # noqa: D102
        if not self._closed:
            self._closed = True
            run_id = self.run_id  # a trainer that logged nothing still gets its run (the config)
            self.client.set_terminated(run_id)

    def _log(self, metrics: list[Any]) -> None:
        run_id = self.run_id
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(run_id, metrics=metrics[i : i + _BATCH])


def _key(key: str) -> str:
    return _BAD_KEY.sub("_", key)


def _flatten(obj: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as ``("a.b.c", "value")`` pairs; lists and leaves as their text."""
    if isinstance(obj, dict):
        if not obj and prefix:
            return [(prefix, "{}")]
        return [pair for k, v in obj.items() for pair in _flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    return [(prefix or "value", str(obj))]
