"""``TensorBoardWriter``: TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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

    Args:
        log_dir: The folder of the event files.
        flush_secs: Longest time events wait in memory before they are written.
    """

    def __init__(self, log_dir: str | Path, flush_secs: float = 10.0) -> None:
        import_backend("tensorboard", "tensorboard", "tensorboard")
        summary = import_backend("torch.utils.tensorboard", "tensorboard", "tensorboard")
        self.log_dir = Path(log_dir)
        self._tb: Any = summary.SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:  # noqa: D102
        for rec, info in zip(records, lines):
            for key, value in scalars(rec):
                self._tb.add_scalar(f"train/{key}", value, global_step=rec["iter"], walltime=info.created)

    def write_eval(self, record: dict[str, Any]) -> None:  # noqa: D102
        for key, value in scalars(record):
            self._tb.add_scalar(key if "/" in key else f"{record['mode']}/{key}", value, global_step=record["iter"])

    def write_config(self, config: dict[str, Any]) -> None:  # noqa: D102
        self._tb.add_text("config", "```\n" + json.dumps(config, indent=2, default=repr) + "\n```")

    def flush(self) -> None:  # noqa: D102
        self._tb.flush()

    def close(self) -> None:  # noqa: D102
        self._tb.close()
