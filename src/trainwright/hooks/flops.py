"""FlopsHook: counts one training iteration's FLOPs, once per ``train()``, for the ``tflops`` / ``mfu`` of log records.

The first iteration of each ``train()`` runs under ``torch.utils.flop_counter.FlopCounterMode``
(a dispatch mode that reads shapes only: no host sync, same numbers); the count
(:class:`~trainwright.logging.flops.StepFlops`) is recorded into the metric store, and the log
lines turn it into each record's ``tflops`` and ``mfu``. The hook is called at that one iteration only. A compiled
run counts its first iteration run eagerly, once, and keeps the count in its checkpoints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainwright.hooks.hook import Hook
from trainwright.logging.flops import NO_FLOPS, StepFlops, flop_counter, peak_tflops
from trainwright.logging.metric_store import MetricStore
from trainwright.logging.throughput import batch_size
from trainwright.model.compile import compiled_parts, run_eagerly
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register
class FlopsHook(Hook):
    """Counts the FLOPs of the first training iteration of each ``train()``; records then carry ``tflops`` and ``mfu``.

    An iteration is one ``train_step``: forward and backward of one batch (under gradient
    accumulation, one micro-batch; the optimizer step is not counted: its element-wise ops
    are no FLOPs ``torch.utils.flop_counter`` counts, which are matmuls, convolutions and
    attention). Each process counts its own iteration, so ``tflops`` is per device:

    * ``tflops`` = the counted FLOPs × (logged batch's samples / counted batch's samples) /
      the line's mean iteration time / 1e12;
    * ``mfu`` = ``tflops`` / ``peak_tflops``, when the peak is known: the argument, else the
      table of :data:`trainwright.logging.flops.PEAKS` for the CUDA device
      (``torch.cuda.get_device_name``) at the run's matmul precision (bf16 / fp16 autocast,
      else the parameters' dtype; float32 as TF32 when ``torch.set_float32_matmul_precision``
      allows it; float8 runs against the bf16 peak, as torchtitan does).

    Without a known peak (a CPU, a GPU missing from the table) records carry ``tflops`` and
    no ``mfu``, and the trainer's logger says so once: a warning for a GPU missing from the table,
    at DEBUG level for a CPU (no CPU has a table entry: saying it on every CPU run is noise).

    A compiled run (``compile=``, a compiled optimizer step) is counted too: ``torch.compile``
    gives up compiling code that first runs under a dispatch mode, so the counted iteration
    runs eagerly (``torch.compiler.set_stance("force_eager")``; a compiled optimizer step runs
    the optimizer's own step) and compilation starts at the next one. That happens once per
    run, at its first iteration: the count is kept in the hook's state (checkpoints hold it),
    so a later ``train()`` and a resumed run reuse it and run no iteration eagerly (a resumed
    run therefore equals the uninterrupted one bit for bit). A compiled run resumed from a
    checkpoint without a count carries no ``tflops`` / ``mfu``, and the logger says why. A
    ``torch.compile``d function called inside ``forward`` that the hook cannot see (compiled
    parts are found on the model and optim wrapper) would run eagerly for the rest of the process:
    switch the hook off for such a model (``default_hooks=dict(flops=None)``).

    Args:
        peak_tflops: The device's dense peak TFLOP/s at the run's precision; overrides the
            table (any device, CPU included).
    """

    priority = "HIGHEST"  # the count starts before any other hook's before_train_iter and ends right after the step

    def __init__(self, peak_tflops: float | None = None) -> None:
        if peak_tflops is not None and (
            isinstance(peak_tflops, bool) or not isinstance(peak_tflops, (int, float)) or not peak_tflops > 0
        ):
            raise ValueError(
                "FlopsHook peak_tflops must be a number > 0 (the device's dense peak TFLOP/s at the run's precision), "
                f"got {peak_tflops!r}"
            )
        self.peak_tflops = float(peak_tflops) if peak_tflops is not None else None
        self._window = range(0)  # the iteration counted in this train() (empty: none)
        self._peak: float | None = None
        self._counter: FlopCounterMode | None = None
        self._eager: contextlib.ExitStack | None = None  # a compiled run's counted iteration: run eagerly
        self._compiled: list[str] = []  # what of this train() is compiled (see _compiled_parts)
        #: ``(flops, samples)`` of the counted iteration (None: not counted yet); the hook's state.
        self.count: tuple[int, int | None] | None = None
        self._said: set[str] = set()  # messages already logged (once per hook)
        self._store: MetricStore | None = None  # the trainer's metric store, set when training starts

    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._store = trainer.metric_store
        start = trainer.progress.iteration
        self._record(start, NO_FLOPS)  # this train()'s lines carry no count until one is recorded
        self._window = range(0)
        self._peak = self.peak_tflops if self.peak_tflops is not None else self._table_peak(trainer)
        self._compiled = compiled_parts(trainer.unwrapped_model, trainer.optim_wrapper)
        if self._compiled and self.count is not None:  # counted earlier in this run, or restored from its checkpoint
            self._record(start, StepFlops(self.count[0], self.count[1], self._peak).values())
            return
        if self._compiled and trainer.progress.iteration > 0:
            self._say(
                trainer,
                "resumed",
                f"FlopsHook: records carry no tflops / mfu in this run: {' and '.join(self._compiled)} "
                f"{'are' if len(self._compiled) > 1 else 'is'} compiled, "
                "and the checkpoint it resumed from holds no FLOP count (counting now would run one iteration eagerly, "
                "and the resumed run would "
                "no longer equal an uninterrupted one). A run started from iteration 0 counts its first iteration and "
                "keeps the count in its checkpoints.",
                level="warning" if self.peak_tflops is not None else "info",
            )
            return
        first = trainer.progress.iteration + 1
        self._window = range(first, first + 1)

    def train_iter_interval(self, trainer: TrainerView) -> range:  # noqa: D102
        return self._window  # called around the counted iteration only

    def before_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None) -> None:  # noqa: D102
        if (
            self._compiled
        ):  # under the counter compiled code must run eagerly (dynamo would give up compiling it for good)
            self._eager = contextlib.ExitStack()
            self._eager.enter_context(run_eagerly(trainer.optim_wrapper))
        self._counter = flop_counter()
        self._counter.__enter__()

    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:  # noqa: D102
        flops = self._stop()
        if flops is None:
            return
        if flops:
            self.count = (flops, batch_size(data_batch))
        self._record(trainer.progress.iteration, StepFlops(flops, batch_size(data_batch), self._peak).values())
        if flops == 0:
            self._say(
                trainer,
                "zero",
                "FlopsHook: the first iteration ran no op that torch.utils.flop_counter counts (matmuls, convolutions, "
                "attention): records carry no tflops / mfu.",
            )

    def state_dict(self) -> dict[str, Any]:
        """The count (``flops``, ``samples``) once taken: a resumed compiled run reuses it instead of running an
        iteration eagerly."""
        return {} if self.count is None else {"flops": self.count[0], "samples": self.count[1]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s count (an empty state: none)."""
        self.count = (int(state_dict["flops"]), state_dict.get("samples")) if state_dict.get("flops") else None

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._stop()  # the counted iteration raised or was cut short: leave the mode

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        self._stop()

    def _stop(self) -> int | None:
        """Leave the counting mode (and a compiled run's eager iteration); the FLOPs counted (None: it was not
        entered)."""
        counter, self._counter = self._counter, None
        eager, self._eager = self._eager, None
        if counter is not None:
            counter.__exit__(None, None, None)
        if eager is not None:
            eager.close()
        return None if counter is None else int(counter.get_total_flops())

    def _record(self, iteration: int, values: Mapping[str, float]) -> None:
        """Record this process's count (:meth:`StepFlops.values`) in the metric store at ``iteration``.

        As plain numbers, straight into the store's buffers: no flush carries them, so the
        processes' agreement exchanges no more numbers, and each process keeps its own count.
        """
        if self._store is not None:
            for name, value in values.items():
                self._store.update_scalar(name, value, iteration)

    def _table_peak(self, trainer: TrainerView) -> float | None:
        """The table's peak for this process's device and the run's precision (None, said once, when unknown)."""
        device = trainer.strategy.device
        param = next((p for p in trainer.unwrapped_model.parameters() if p.is_floating_point()), None)
        column = trainer.strategy.precision.peak_column(param.dtype if param is not None else None)
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        peak = peak_tflops(device_name, column) if device.type == "cuda" else None
        if peak is None:
            self._say(
                trainer,
                "peak",
                f"FlopsHook: the peak TFLOP/s of {device_name!r} at {column} is not in "
                "trainwright.logging.flops.PEAKS, so records carry "
                "tflops but no mfu. Give the device's dense peak at the run's precision: "
                "default_hooks=dict(flops=dict(peak_tflops=...)).",
                level="warning" if device.type != "cpu" else "debug",
            )
        return peak

    def _say(self, trainer: TrainerView, key: str, message: str, level: str = "info") -> None:
        """Log ``message`` once per hook at ``level`` (``"warning"`` when the user asked for what cannot be given)."""
        if key not in self._said:
            self._said.add(key)
            getattr(trainer.logger, level)(message)
