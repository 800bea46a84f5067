"""``TensorBoardWriter``: TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainwright.logging.resume import Resumed, newest
from trainwright.logging.writers import LineInfo, Writer, import_backend, scalars


class TensorBoardWriter(Writer):
    """Writes every logged number as a TensorBoard scalar, at its iteration.

    Tags: training values as ``train/<key>`` (``train/loss``, ``train/lr``, ``train/time``),
    evaluation metrics under their own keys (``val/acc``, ``test/acc``), all with the
    iteration as the step and the log line's time as the wall time. The resolved config is
    a text summary ``config`` (JSON). Events reach the file at every :meth:`flush` (the trainer
    flushes before checkpoints and at the end) and at the latest every ``flush_secs``.

    ``Trainer(writers=["console", "jsonl", "tensorboard"])`` writes to ``<run folder>/tensorboard``;
    view it with ``tensorboard --logdir work_dirs``. Needs ``pip install 'trainwright[tensorboard]'``.

    The event file is opened at the first event. A resumed run (:meth:`resume`) writes on in the
    TensorBoard folder of the run it resumes, with ``purge_step`` one past the checkpoint's
    iteration: TensorBoard drops what the earlier run logged past it, so the curve shows each
    step once and the resumed run makes no second run in ``--logdir``.

    Args:
        log_dir: The folder of the event files.
        flush_secs: Longest time events wait in memory before they are written.
    """

    def __init__(self, log_dir: str | Path, flush_secs: float = 10.0) -> None:
        import_backend("tensorboard", "tensorboard", "tensorboard")
        self._summary = import_backend("torch.utils.tensorboard", "tensorboard", "tensorboard")
        #: The folder of the event files (after :meth:`resume`: the folder of the run it continues).
        self.log_dir = Path(log_dir)
        self.flush_secs = flush_secs
        self._purge_step: int | None = None
        self._config: str | None = None  # the config's text, written with the first events
        self._tb: Any = None

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:  # noqa: D102
        tb = self._writer()
        for rec, info in zip(records, lines):
            for key, value in scalars(rec):
                tb.add_scalar(f"train/{key}", value, global_step=rec["iter"], walltime=info.created)

    def write_eval(self, record: dict[str, Any]) -> None:  # noqa: D102
        tb = self._writer()
        for key, value in scalars(record):
            tb.add_scalar(key if "/" in key else f"{record['mode']}/{key}", value, global_step=record["iter"])

    def write_config(self, config: dict[str, Any]) -> None:  # noqa: D102
        self._config = "```\n" + json.dumps(config, indent=2, default=repr) + "\n```"
        if self._tb is not None:
            self._write_config()

    def resume(self, at: Resumed) -> None:
        """Write on in the newest TensorBoard folder among this one and the earlier run folders' (this one when none
        holds events), purging the steps past ``at.iteration``."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        events = [f for d in at.places(self.log_dir) if d.is_dir() for f in d.glob("events.out.tfevents.*")]
        found = newest(events)
        if found is not None:
            self.log_dir = found.parent
        self._purge_step = at.iteration + 1

    def flush(self) -> None:  # noqa: D102
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:  # noqa: D102
        if self._tb is None and self._config is not None:
            self._writer()  # a run that logged nothing still shows its config
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        self._config = None  # closed: a second close opens nothing

    def _writer(self) -> Any:
        if self._tb is None:
            self._tb = self._summary.SummaryWriter(
                log_dir=str(self.log_dir), flush_secs=self.flush_secs, purge_step=self._purge_step
            )
            if self._config is not None:
                self._write_config()
        return self._tb

    def _write_config(self) -> None:
        self._tb.add_text("config", self._config, global_step=self._purge_step)
