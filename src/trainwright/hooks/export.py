"""SafetensorsExportHook: Hugging Face-style safetensors folders of the weights while training runs, written off the
training thread."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from trainwright.hooks.hook import Hook
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.checkpoint.async_writer import AsyncCheckpointWriter
    from trainwright.hooks.view import TrainerView

# The writer and the safetensors export load when the hook is built (a run without it does not keep their code).

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def shard_bytes(size: int | str) -> int:
    """``max_shard_size`` in bytes: an int, or Hugging Face's spelling (``"5GB"``, ``"500MB"``, ``"2GiB"``).

    Raises:
        ValueError: another value, naming the accepted spellings.
    """
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", str(size), re.IGNORECASE)
    if m is None or float(m[1]) <= 0:
        raise ValueError(f"max_shard_size={size!r}: give a number of bytes or e.g. '5GB', '500MB', '2GiB'")
    return int(float(m[1]) * _UNITS[(m[2] or "").upper()])


@HOOKS.register_module()
class SafetensorsExportHook(Hook):
    """Every ``interval`` iterations and at the end of training, export the weights as ``<out_dir>/iter_<N>/``:
    ``model.safetensors`` (sharded with ``model.safetensors.index.json`` above ``max_shard_size``) and the model's
    ``config.json`` where it has a Hugging Face config (``model.config``).

    The training thread only copies the weights into reused staging buffers (what an async checkpoint save costs,
    :class:`~trainwright.checkpoint.async_writer.AsyncCheckpointWriter`); a writer thread writes the folder whole
    (a temporary folder renamed into place). Tied parameters are stored once, and read back tied by
    :func:`trainwright.checkpoint.load_exported` / :func:`~trainwright.checkpoint.read_exported`. One export is in
    flight at a time; the end of training waits for the last one and raises its error.

    Args:
        interval: Export every ``interval`` iterations (<= 0: only at the end).
        out_dir: The exports' folder (default ``<run_dir>/exports``); a local folder.
        at_end: Export when training ends (unless that iteration was just exported).
        max_shard_size: Bytes per safetensors file (an int, or ``"5GB"``, ``"500MB"``); larger models are sharded.
    """

    priority = "VERY_LOW"

    def __init__(
        self,
        interval: int = 1000,
        out_dir: str | Path | None = None,
        at_end: bool = True,
        max_shard_size: int | str = "5GB",  # checkpoint.export.DEFAULT_SHARD_BYTES
    ) -> None:
        from trainwright.checkpoint.async_writer import AsyncCheckpointWriter

        self.interval = interval
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.at_end = at_end
        self.max_shard_bytes = shard_bytes(max_shard_size)
        #: The folders exported so far in this process, oldest first.
        self.exported: list[Path] = []
        self._writer: AsyncCheckpointWriter = AsyncCheckpointWriter()
        self._config: str | None = None
        self._last = -1

    @override
    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        return max(self.interval, 0)

    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        from trainwright.checkpoint.export import config_json

        self._config = config_json(trainer.unwrapped_model)

    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:  # noqa: D102
        it = trainer.progress.iteration
        if self.interval > 0 and it % self.interval == 0:
            self.export(trainer)

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        if self.at_end and trainer.progress.iteration != self._last:
            self.export(trainer)
        self._writer.wait()

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        try:
            self._writer.release()  # after a failed run: the export in flight, whose error must not hide the run's
        except Exception as e:  # noqa: BLE001
            trainer.logger.error(f"SafetensorsExportHook: the last export ({self.exported[-1]}) failed: {e}")

    def export(self, trainer: TrainerView) -> Path:
        """Export the weights now as ``<out_dir>/iter_<N>`` (every rank calls it: gathering sharded weights is a
        collective; rank 0 writes); returns the folder, complete once the writer thread is done."""
        it = trainer.progress.iteration
        folder = (self.out_dir or trainer.run_dir / "exports") / f"iter_{it}"
        state = trainer.strategy.full_model_state_dict()
        self._last = it
        if not trainer.strategy.is_main_process:
            return folder
        from trainwright.checkpoint.export import split_tied, write_exported

        stored, aliases = split_tied(state)
        config, max_bytes = self._config, self.max_shard_bytes

        def write(data: Any, path: Any) -> None:
            write_exported(data, path, aliases=aliases, config=config, max_shard_bytes=max_bytes)

        self._writer.submit(stored, folder, write=write)
        self.exported.append(folder)
        return folder
