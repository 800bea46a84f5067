"""``WandbWriter``: a Weights & Biases run whose files live in the run folder (``<run folder>/wandb/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwright.logging.writers import LineInfo, Writer, import_backend, scalars


class WandbWriter(Writer):
    """Logs to a W&B run: training values as ``train/<key>``, evaluation metrics under their keys, the config as the run
    config.

    Every call is committed at once, with the iteration as the ``iter`` field and the x axis
    of every chart (``define_metric("*", step_metric="iter")``), so a training line and the
    validation at the same iteration line up, and nothing waits for a later step. The run is started when the writer is
    built (rank 0
    only) and finished by :meth:`close` (the trainer's ``close()``).

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
        wandb = import_backend("wandb", "wandb", "wandb")
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        kwargs = dict(init_kwargs or {})
        kwargs.setdefault("name", self.dir.name)
        for key, value in (("project", project), ("name", name), ("mode", mode)):
            if value is not None:
                kwargs[key] = value
        self.run: Any = wandb.init(dir=str(self.dir), **kwargs)
        self.run.define_metric("iter", hidden=True)
        self.run.define_metric("*", step_metric="iter")

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:  # noqa: D102
        for rec in records:
            self.run.log({"iter": rec["iter"], **{f"train/{k}": v for k, v in scalars(rec)}})

    def write_eval(self, record: dict[str, Any]) -> None:  # noqa: D102
        self.run.log(
            {"iter": record["iter"], **{(k if "/" in k else f"{record['mode']}/{k}"): v for k, v in scalars(record)}}
        )

    def write_config(self, config: dict[str, Any]) -> None:  # noqa: D102
        self.run.config.update(config, allow_val_change=True)

    def close(self) -> None:  # noqa: D102
        if self.run is not None:
            self.run.finish()
            self.run = None
