"""LoggerHook: a training record every ``interval`` iterations and one per evaluation, sent to every writer.

At a logging iteration the hook holds a :class:`~trainwright.logging.lines.LineRequest` in
``trainer.log_lines`` (no numbers yet); held lines are written together, at most once per
``flush_secs`` (under several processes at the train loop's next agreement point). The hook
owns no numbers: the metric store keeps them (and is checkpointed).
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwright.checkpoint.remote_io import publish_with_fallback
from trainwright.checkpoint.storage import Location, RemotePath, Store, location
from trainwright.data.stream_state import batches_per_pass
from trainwright.hooks.hook import EveryInEpoch, Hook
from trainwright.hooks.phase_peaks import PhasePeaks
from trainwright.hooks.view import require_train_loop
from trainwright.logging.lines import LineRequest
from trainwright.logging.log_processor import CustomStat, LogProcessor
from trainwright.logging.resume import Resumed
from trainwright.logging.throughput import batch_size, num_tokens, tokens_counter
from trainwright.logging.writers import LineInfo
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register
class LoggerHook(Hook):
    """Logs training scalars at an interval and validation / test metrics after each pass.

    Each training record holds the mean of every loss and of the times over the
    iterations since the previous line (``interval`` of them, fewer for an epoch's or the
    run's short tail), the latest value of other logged outputs, the learning rate, the grad
    norm, the loss scale and the throughput: ``samples_per_s`` (samples of the logged
    iteration's batch × processes / mean iteration time), ``tokens_per_s`` when the model
    (its ``count_tokens(data_batch)`` method) or the batch says how many tokens it holds (see
    :mod:`trainwright.logging.throughput`), ``tflops`` / ``mfu`` when the ``flops`` hook
    counted an iteration (see :class:`~trainwright.hooks.flops.FlopsHook`) and, on a device
    whose allocator reports a peak (CUDA, ``torch.accelerator`` devices), ``max_memory_mb``:
    the peak memory allocated during the line's training iterations (MiB; validation and
    checkpoint saves left out: see :class:`~trainwright.hooks.phase_peaks.PhasePeaks`). Validation
    and test records carry the pass's own ``max_memory_mb``; a checkpoint save's peak is
    logged as a message when the phase after it starts (validation, the next epoch, the end).
    The writers of ``trainer.log_lines.writers`` show it (the console adds the ETA) or store it.

    The run's last iteration always gets a line (iteration-based: 50 iterations logged every
    20 give lines at 20, 40 and 50, the last averaging 41-50).

    A run that resumed from a checkpoint at iteration ``k`` tells the writers before its first
    line (:meth:`~trainwright.logging.Writers.resume`): what earlier runs of the work dir logged
    past ``k`` (a killed run logs beyond its last checkpoint) is superseded, since this run logs
    those iterations again — files are cut back to ``k``, TensorBoard purges the steps past it,
    W&B and MLflow continue the same run.

    Turning numbers into text is the costly part of logging, so held lines are written
    together: on one process the hook flushes the store and writes them; under several it
    proposes the write to ``trainer.metric_store.agreement``. Epoch ends, the end of training, evaluations
    and ``Trainer.flush_logs()`` write what is held.

    Args:
        interval: Iterations between log lines; in an epoch-based run counted within the epoch,
            as mmengine's (45 iterations per epoch, ``interval=10``: lines after each epoch's
            10th, 20th, 30th and 40th iteration and at its end).
        ignore_last: Skip the log line for an epoch's last, shorter interval (not the run's
            last; as mmengine, only when the epoch is longer than the interval).
        window_size: mmengine's ``log_processor.window_size``: losses and times are averaged
            over this many iterations ending at each line (lines then overlap or skip
            iterations, as mmengine's); None (default): over the line's own iterations.
        custom_cfg: mmengine's ``log_processor.custom_cfg``: more numbers per record, each
            ``dict(data_src=..., method_name="mean" | "min" | "max" | "current",
            window_size=int | "epoch" | "global", log_name=...)`` (see
            :class:`~trainwright.logging.log_processor.CustomStat`). Both make the hook's
            :attr:`processor`, which it gives to the held lines when training starts (without
            them the lines use the trainer's).
        flush_secs: While training runs faster than one line per ``flush_secs``, lines are
            written in batches at most this far apart (0 writes each line at once). With
            several processes any process's proposal is agreed at the train loop's next
            agreement point (every ``trainer.metric_store.agreement.every`` iterations), which writes
            the lines, with the numbers reduced over the processes (``data_time`` the
            maximum, the rest the mean).
        out_dir: Also keep the run folder's logs (``train.log``, ``metrics.jsonl``, the config
            dump: the files ending in ``out_suffix``) in ``out_dir/<run folder name>/``: a local
            folder or an fsspec URL (``s3://bucket/logs``; mmengine's name). They are copied at
            each checkpoint and at the end of each run (by the main process), never per step; a
            failed upload is a warning (the files stay in the run folder) and is tried again next time.
        out_suffix: Which files of the run folder go to ``out_dir`` (by how their names end).
        storage_options: fsspec options of a URL ``out_dir`` (e.g. s3fs's
            ``dict(client_kwargs=dict(endpoint_url=...))``); credentials otherwise from the environment.
        interval_exp_name / log_metric_by_epoch / keep_local / file_client_args / backend_args:
            mmengine's arguments, accepted so its configs load. ``interval_exp_name`` has no
            effect (the run folder is named after the experiment, and its first lines say it);
            writers step evaluation metrics by iteration whatever ``log_metric_by_epoch`` says
            (each record carries its epoch too); ``keep_local=False`` (deleting the local logs
            after the copy) and storage backends (``file_client_args`` / ``backend_args``; use
            a URL ``out_dir`` with ``storage_options``) are refused.
    """

    priority = "BELOW_NORMAL"

    def __init__(
        self,
        interval: int = 10,
        ignore_last: bool = False,
        flush_secs: float = 1.0,
        window_size: int | None = None,
        custom_cfg: Sequence[Mapping[str, Any]] | None = None,
        out_dir: str | Path | None = None,
        out_suffix: str | Sequence[str] = (".json", ".jsonl", ".log", ".py", ".yaml"),
        storage_options: dict[str, Any] | None = None,
        interval_exp_name: int = 1000,
        log_metric_by_epoch: bool = True,
        keep_local: bool = True,
        file_client_args: Mapping[str, Any] | None = None,
        backend_args: Mapping[str, Any] | None = None,
    ) -> None:
        if not keep_local:
            raise ValueError(
                "LoggerHook keep_local=False (delete the run folder's logs once copied to out_dir) is not supported: "
                "the logs stay local too"
            )
        if file_client_args is not None or backend_args is not None:
            raise ValueError(
                "LoggerHook file_client_args / backend_args (mmengine's storage backends) are not supported: give "
                "out_dir as a URL "
                "(s3://bucket/logs) and its fsspec options as storage_options=dict(...)"
            )
        if storage_options is not None and not (isinstance(out_dir, str) and "://" in out_dir):
            raise ValueError(
                "LoggerHook storage_options apply to a URL out_dir (s3://..., memory://...), but out_dir is "
                f"{out_dir!r}; drop storage_options or give a URL"
            )
        #: Where the run folder's logs are copied (None: nowhere); a URL is decided here, once.
        self.out_dir: Location | None = location(out_dir, storage_options) if out_dir is not None else None
        #: The remote store of a URL ``out_dir`` (checked by the trainer at start), else None.
        self.store: Store | None = self.out_dir.store if isinstance(self.out_dir, RemotePath) else None
        self.out_suffix = (out_suffix,) if isinstance(out_suffix, str) else tuple(out_suffix)
        if interval < 1:
            raise ValueError(f"LoggerHook interval must be >= 1, got {interval}")
        #: This hook's log processor (``window_size`` / ``custom_cfg``); None: the trainer's lines keep theirs.
        self.processor = (
            LogProcessor(window_size, custom_cfg, owner="LoggerHook") if window_size is not None or custom_cfg else None
        )
        if flush_secs < 0:
            raise ValueError(f"LoggerHook flush_secs must be >= 0, got {flush_secs}")
        self.interval = interval
        self.ignore_last = ignore_last
        self.flush_secs = flush_secs
        self._last_idx = -1
        self._by_epoch = True
        self._epoch_len = 0
        self._max_iters = 0
        self._log_scale = False
        self._line_iter = 0  # iteration of the latest line (requested), or the last one before the run started
        self._hub_seen: dict[str, int] = {}  # message-hub train/ scalar -> its count at the previous line
        self._peaks: PhasePeaks | None = None  # the device's peak memory per phase; None where it reports none (CPU)
        self._tokens: Callable[[Any], Any] = num_tokens  # the model's count_tokens, else the batch's own count
        self._trained = False  # a train() ran with this hook (a later one continues its own lines)

    def stores(self) -> tuple[Store, ...]:
        """The store of a URL ``out_dir`` (the Trainer checks it before it creates anything)."""
        return (self.store,) if self.store is not None else ()

    # -- training ---------------------------------------------------------------------------
    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        loop = require_train_loop(trainer, "LoggerHook.before_train")
        self._by_epoch = loop.by_epoch
        self._epoch_len = batches_per_pass(loop.dataloader) or 0  # 0: an endless stream (lines by iteration only)
        self._max_iters = loop.max_iters
        # Only a float16 GradScaler has a loss scale to log (it may not exist before the first step).
        precision = getattr(trainer.optim_wrapper, "precision", None)
        self._log_scale = precision is not None and precision.scales_loss
        # as mmengine: an epoch's last, short interval is logged unless ignore_last (and the epoch is longer than the
        # interval)
        self._last_idx = (
            self._epoch_len - 1 if loop.by_epoch and (not self.ignore_last or self._epoch_len <= self.interval) else -1
        )
        start = trainer.progress.iteration
        if start > 0 and (not self._trained or start < self._line_iter) and trainer.strategy.is_main_process:
            # a resumed run (a checkpoint restored before this process trained, or an earlier point than its own lines)
            trainer.log_lines.writers.resume(Resumed.of(start, trainer.run_dir))
        self._trained = True
        self._line_iter = self._line_at_or_before(start)
        self._hub_seen = {
            k: b.count for k, b in trainer.message_hub.log_scalars.items()
        }  # what was written before this run is not this run's
        self._peaks = PhasePeaks.of(trainer.strategy.device)
        if self._peaks is not None:
            self._peaks.start()
        self._tokens = tokens_counter(trainer.unwrapped_model)
        # Lines are due at least every flush_every iterations (see after_train_iter): the lines keep the store's history
        # for that.
        trainer.log_lines.start(
            trainer.progress.iteration, self.processor, line_every=self.interval, epoch_len=self._epoch_len
        )

    @property
    def window_size(self) -> int | None:
        """Iterations each line averages over (mmengine's ``log_processor.window_size``; None: the line's own)."""
        return None if self.processor is None else self.processor.window_size

    @property
    def custom(self) -> tuple[CustomStat, ...]:
        """The custom statistics of each record (mmengine's ``log_processor.custom_cfg``)."""
        return () if self.processor is None else self.processor.custom

    def train_iter_interval(self, trainer: TrainerView) -> int | EveryInEpoch:  # noqa: D102
        # the loop calls after_train_iter at multiples of the interval (counted within the epoch in an epoch-based run,
        # as mmengine's every_n_inner_iters), at epoch ends and at the run's last iteration only
        if self._by_epoch and self._epoch_len % self.interval:
            return EveryInEpoch(self.interval, self._epoch_len)
        return self.interval

    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:  # noqa: D102
        it = trainer.progress.iteration
        if (
            it <= self._line_iter
        ):  # logged already: iterations run again after a rollback (spike_guard) get no second line
            return
        if (
            (batch_idx + 1 if self._by_epoch else it) % self.interval == 0
            or batch_idx == self._last_idx
            or it == self._max_iters
        ):
            # Runs once per interval, so its code is cold each time: keep it to reading values.
            p = trainer.progress
            ow = trainer.optim_wrapper
            scale = ow.loss_scale if self._log_scale else None
            if scale is not None:
                scale = float(scale)
            memory = self._peaks.train_peak() if self._peaks is not None else None
            line = LineInfo(time.time(), batch_idx + 1, self._by_epoch, self._epoch_len, self._max_iters)
            lines = trainer.log_lines
            lines.hold(
                LineRequest(
                    line,
                    it,
                    p.epoch + 1 if self._by_epoch else p.epoch,
                    ow.get_lr(),
                    getattr(ow, "grad_norm", None),
                    scale,
                    self._line_iter,
                    batch_size(data_batch),
                    self._tokens(data_batch),
                    memory,
                    self._hub_scalars(trainer),
                )
            )
            self._line_iter = it
            if (
                time.perf_counter() - lines.last_write >= self.flush_secs
                or it - lines.written_to >= trainer.metric_store.flush_every
            ):
                if trainer.metric_store.agreement.local:
                    self.write_pending(trainer)
                else:
                    trainer.metric_store.agreement.propose_write()

    def after_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self.write_pending(trainer)  # the loop flushed the store: the epoch's last lines go out now

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self.write_pending(trainer)
        self._phase(trainer, "train")

    # -- peak memory per phase (training, evaluation, checkpoint saves) ----------------------
    def _hub_scalars(self, trainer: TrainerView) -> dict[str, float] | None:
        """The mean of each message-hub ``train/<name>`` scalar written since the previous line, as ``<name>``
        (mmengine logs them)."""
        out: dict[str, float] = {}
        for key, buf in trainer.message_hub.log_scalars.items():
            if key.startswith("train/"):
                new = buf.count - self._hub_seen.get(key, 0)
                if new > 0:
                    out[key[len("train/") :]] = buf.mean(new)
                    self._hub_seen[key] = buf.count
        return out or None

    def before_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self._phase(trainer, "train")  # ends a save at the previous epoch's end

    def before_save_checkpoint(self, trainer: TrainerView, checkpoint: dict) -> None:  # noqa: D102
        self._phase(trainer, "save")

    def _phase(self, trainer: TrainerView, phase: str) -> float | None:
        """Begin ``phase`` of the peak counter; the peak of the evaluation it ends (a save's is logged here, with its
        iteration)."""
        if self._peaks is None:
            if phase != "eval":
                return None
            self._peaks = PhasePeaks.of(trainer.strategy.device)  # val() / test() without training
            if self._peaks is None:
                return None
            self._peaks.start()
        ended, peak = self._peaks.phase, self._peaks.begin(phase)
        if ended == "save" and peak is not None:
            trainer.logger.info(
                f"Checkpoint save at iteration {trainer.progress.iteration}: peak memory allocated {peak:.1f} MiB"
            )
        return peak if ended == "eval" else None

    def write_pending(self, trainer: TrainerView) -> None:
        """Flush the store (a no-op when nothing is pending) and write every held line; at the same point on every
        process, as any store flush."""
        trainer.metric_store.flush()
        trainer.log_lines.write()

    def _line_at_or_before(self, iteration: int) -> int:
        """The iteration of the last line at or before ``iteration`` (a resumed run's first line averages from
        there)."""
        n, length = self.interval, self._epoch_len
        if not (self._by_epoch and length):
            return iteration - iteration % n
        start = iteration - iteration % length  # the previous epoch's end
        pos = iteration - start
        if pos >= n or start == 0:
            return start + pos - pos % n
        if self._last_idx >= 0:  # the previous epoch's end had a line
            return start
        return start - length + length // n * n  # its last multiple of the interval

    # -- copies of the logs -----------------------------------------------------------------
    def after_save_checkpoint(self, trainer: TrainerView, path: Location) -> None:
        """Copy the logs at each checkpoint (the copy then holds the lines up to it)."""
        if self.out_dir is not None:
            self.copy_logs(trainer)

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        if self.out_dir is not None:
            self.copy_logs(trainer)

    def copy_logs(self, trainer: TrainerView) -> None:
        """Copy the run folder's logs to ``out_dir/<run folder name>/`` (main process); a failure is a warning."""
        if self.out_dir is None or not trainer.strategy.is_main_process:
            return
        trainer.log_lines.writers.flush()
        for h in trainer.logger.handlers:
            h.flush()
        run_dir = trainer.run_dir
        dest = self.out_dir / run_dir.name
        files = [f for f in sorted(run_dir.iterdir()) if f.is_file() and f.name.endswith(self.out_suffix)]
        if isinstance(
            dest, RemotePath
        ):  # published to the store; the first failure warns and ends this copy (the files stay in the run folder)
            then = f"LoggerHook: the logs are in {run_dir}, and the copy is tried again at the next checkpoint."
            for f in files:
                if publish_with_fallback(f, dest / f.name, keep=False, what="the logs", then=then) != dest / f.name:
                    break
            return
        try:
            dest.mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copy2(f, dest / f.name)
        except OSError as e:  # a copy of the logs never stops training
            warnings.warn(
                f"LoggerHook could not copy the logs of {run_dir} to {dest} ({type(e).__name__}: {e}); they are in "
                f"{run_dir}, and the copy is "
                "tried again at the next checkpoint.",
                stacklevel=2,
            )

    # -- evaluation -------------------------------------------------------------------------
    def before_val_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self._phase(trainer, "eval")

    def before_test_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self._phase(trainer, "eval")

    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        memory = self._phase(trainer, "train")
        if metrics is not None:  # None: a stop request cut the pass, there is nothing to log
            self._log_eval(trainer, "val", metrics, memory)

    def after_test_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        memory = self._phase(trainer, "train")
        if metrics is not None:
            self._log_eval(trainer, "test", metrics, memory)

    def _log_eval(
        self, trainer: TrainerView, mode: str, metrics: dict[str, float], memory: float | None = None
    ) -> None:
        self.write_pending(trainer)  # pending training lines first, in order
        p = trainer.progress
        record = {"mode": mode, "epoch": p.epoch, "iter": p.iteration, **{k: float(v) for k, v in metrics.items()}}
        if memory is not None:
            record["max_memory_mb"] = memory
        trainer.log_lines.write_eval(record)
