"""``WandbWriter``: a Weights & Biases run whose files live in the run folder (``<run folder>/wandb/``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainwright.logging.resume import Resumed, newest, replace_text
from trainwright.logging.writers import LineInfo, Writer, import_backend, scalars

#: The file beside W&B's own (``<dir>/wandb/``) that keeps the run's id for a resumed run.
RUN_FILE = "trainwright-run.json"


class WandbWriter(Writer):
    """Logs to a W&B run: training values as ``train/<key>``, evaluation metrics under their keys, the config as the run
    config.

    Every call is committed at once, with the iteration as the ``iter`` field and the x axis
    of every chart (``define_metric("*", step_metric="iter")``), so a training line and the
    validation at the same iteration line up, and nothing waits for a later step. The run is started at the first
    record (rank 0 only; its id kept in ``<dir>/wandb/trainwright-run.json``) and finished by :meth:`close` (the
    trainer's ``close()``). A resumed trainer (:meth:`resume`) continues the W&B run of the run it resumes
    (``wandb.init(id=..., resume="allow")``, its name kept): one run, one curve.

    Works offline: with ``WANDB_MODE=offline`` in the environment (or ``mode="offline"``)
    nothing leaves the machine; the run is kept in ``<dir>/wandb/offline-run-*/`` and
    ``wandb sync`` uploads it later. Needs ``pip install 'trainwright[wandb]'``.

    Args:
        dir: Where W&B keeps the run's files (``Trainer(writers=["wandb"])``: the run folder).
        project: W&B project (default: W&B's own, ``WANDB_PROJECT``).
        name: Display name of the run; None: the name of ``dir`` (with ``writers=["wandb"]``, the trainer's run folder).
        mode: ``"online"``, ``"offline"`` or ``"disabled"``; None: ``WANDB_MODE`` or online.
        init_kwargs: More arguments of ``wandb.init`` (``entity``, ``tags``, ``group``, ...).
    """

    def __init__(
        self,
        dir: str | Path,
        project: str | None = None,
        name: str | None = None,
        mode: str | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._wandb = import_backend("wandb", "wandb", "wandb")
        self.dir = Path(dir)
        kwargs = dict(init_kwargs or {})
        for key, value in (("project", project), ("name", name), ("mode", mode)):
            if value is not None:
                kwargs[key] = value
        self._kwargs = kwargs
        self._config: dict[str, Any] | None = None
        self._resume_id: str | None = None
        self._closed = False
        #: The W&B run (None until the first record, and after :meth:`close`).
        self.run: Any = None

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:  # noqa: D102
        run = self._start()
        for rec in records:
            run.log({"iter": rec["iter"], **{f"train/{k}": v for k, v in scalars(rec)}})

    def write_eval(self, record: dict[str, Any]) -> None:  # noqa: D102
        self._start().log(
            {"iter": record["iter"], **{(k if "/" in k else f"{record['mode']}/{k}"): v for k, v in scalars(record)}}
        )

    def write_config(self, config: dict[str, Any]) -> None:  # noqa: D102
        self._config = config
        if self.run is not None:
            self.run.config.update(config, allow_val_change=True)

    def resume(self, at: Resumed) -> None:
        """Continue the W&B run whose id the newest earlier run folder (or this one) kept."""
        found = newest(at.places(self.dir / "wandb" / RUN_FILE))
        if found is not None and self.run is None:
            run_id = json.loads(found.read_text(encoding="utf-8")).get("id")
            self._resume_id = run_id if isinstance(run_id, str) else None

    def close(self) -> None:  # noqa: D102
        if self.run is None and not self._closed:
            self._start()  # a trainer that logged nothing still shows its config
        self._closed = True
        if self.run is not None:
            self.run.finish()
            self.run = None

    def _start(self) -> Any:
        if self.run is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            kwargs = dict(self._kwargs)
            if self._resume_id is not None:
                kwargs.update(id=self._resume_id, resume="allow")  # its name stays the run's
            else:
                kwargs.setdefault("name", self.dir.name)
            self.run = self._wandb.init(dir=str(self.dir), **kwargs)
            self.run.define_metric("iter", hidden=True)
            self.run.define_metric("*", step_metric="iter")
            if self._config is not None:
                self.run.config.update(self._config, allow_val_change=True)
            (self.dir / "wandb").mkdir(parents=True, exist_ok=True)
            replace_text(self.dir / "wandb" / RUN_FILE, json.dumps({"id": self.run.id}) + "\n")
        return self.run
