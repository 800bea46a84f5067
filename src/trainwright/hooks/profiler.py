"""ProfilerHook: a ``torch.profiler`` trace of a window of training iterations, written to the run folder.

The hook returns its window from ``train_iter_interval``, so the loop calls it only inside it: the
profiler starts at the window's first iteration, steps after each one and stops after the last.
Each recorded cycle becomes ``run_dir/profiler/trace_rank<r>_iter<a>-<b>.json`` (a Chrome trace).
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView

_ACTIVITIES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA"}


@HOOKS.register
class ProfilerHook(Hook):
    """Profiles a window of training iterations with ``torch.profiler``; writes Chrome traces (JSON) to the run folder.

    The window follows ``torch.profiler.schedule``, counted from the first iteration of each
    ``train()``: ``skip_first`` iterations are skipped, then each of ``repeat`` cycles waits
    ``wait`` iterations, warms up for ``warmup`` (profiling, results dropped) and records
    ``active``. Each recorded cycle is written as
    ``run_dir/profiler/trace_rank<rank>_iter<first>-<last>.json`` (iteration numbers are
    run-wide, 1-based), which https://ui.perfetto.dev or ``chrome://tracing`` opens. Every
    process writes its own trace.

    Args:
        wait / warmup / active / repeat / skip_first: The schedule, as in
            ``torch.profiler.schedule`` (``repeat=0``: cycle until training ends).
        activities: What to profile: ``"cpu"``, ``"cuda"`` (names or ``ProfilerActivity``);
            None: the CPU, and CUDA when the run's device is a GPU.
        record_shapes / profile_memory / with_stack / with_flops: Passed to ``torch.profiler.profile``.
        tensorboard: Also write each cycle in the format of TensorBoard's PyTorch profiler
            plugin, to ``run_dir/profiler/tensorboard`` (``tensorboard --logdir <run_dir>/profiler``).
            Needs the ``tensorboard`` package (and ``torch-tb-profiler`` to view it).
        out_dir: Where traces go instead of ``run_dir/profiler``.

    Raises:
        ValueError: a negative schedule number, ``active < 1``, or an unknown activity.
        ImportError: ``tensorboard=True`` without the ``tensorboard`` package (the message says what to install).
    """

    priority = "VERY_LOW"  # steps the profiler after the other hooks' after_train_iter: their work is in the step

    def __init__(
        self,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        skip_first: int = 0,
        activities: list[Any] | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        tensorboard: bool = False,
        out_dir: str | Path | None = None,
    ) -> None:
        for name, v in dict(wait=wait, warmup=warmup, repeat=repeat, skip_first=skip_first).items():
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"ProfilerHook {name} must be an int >= 0, got {v!r}")
        if not isinstance(active, int) or active < 1:
            raise ValueError(f"ProfilerHook active must be an int >= 1 (iterations recorded per cycle), got {active!r}")
        self.wait, self.warmup, self.active, self.repeat, self.skip_first = wait, warmup, active, repeat, skip_first
        self.activities = None if activities is None else [_activity(a) for a in activities]
        if tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ImportError(
                "ProfilerHook(tensorboard=True) needs TensorBoard: pip install tensorboard torch-tb-profiler (or pass "
                "tensorboard=False for Chrome traces only)"
            )
        self.options = dict(
            record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops
        )
        self.tensorboard = tensorboard
        self.out_dir = None if out_dir is None else Path(out_dir)
        #: The traces written so far (Chrome trace JSON files).
        self.traces: list[Path] = []
        self._window = range(0)
        self._prof: Any = None
        self._recording_from: int | None = None
        self._iteration = 0
        self._dir = Path()
        self._rank = 0
        self._logger: Any = None

    def train_iter_interval(self, trainer: TrainerView) -> range:  # noqa: D102
        loop = require_train_loop(trainer, "ProfilerHook")
        start = trainer.progress.iteration  # this train() begins after it (a resumed run: where it resumes)
        first = start + self.skip_first + 1
        last = (
            start + self.skip_first + self.repeat * (self.wait + self.warmup + self.active)
            if self.repeat
            else loop.max_iters
        )
        self._window = range(first, min(last, loop.max_iters) + 1)
        self._dir = self.out_dir or trainer.run_dir / "profiler"
        self._rank = trainer.strategy.rank
        self._logger = trainer.logger
        return self._window  # called only inside the window: nothing per iteration elsewhere

    def before_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None) -> None:  # noqa: D102
        if self._prof is None and trainer.progress.iteration + 1 == self._window.start:
            sched = torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat)
            activities = self.activities
            if activities is None:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if trainer.strategy.device.type == "cuda":
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(
                activities=activities,
                schedule=sched,
                on_trace_ready=self._save,
                **self.options,  # type: ignore[arg-type]
            )
            self._prof.start()

    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:  # noqa: D102
        prof = self._prof
        if prof is None:
            return
        self._iteration = it = trainer.progress.iteration
        if self._recording_from is None and prof.current_action in (
            torch.profiler.ProfilerAction.RECORD,
            torch.profiler.ProfilerAction.RECORD_AND_SAVE,
        ):
            self._recording_from = it
        if it < self._window[-1] or prof.current_action == torch.profiler.ProfilerAction.RECORD_AND_SAVE:
            prof.step()  # after the last active iteration of a cycle this writes its trace
        if it >= self._window[-1]:
            self._stop()  # (training ends inside a cycle: what it recorded is written, with no empty step after it)

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._stop()  # training ended inside the window: the iterations recorded so far are written

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        self._stop()

    def _stop(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()

    def _save(self, prof: Any) -> None:
        """``on_trace_ready``: write the cycle just recorded."""
        first = self._recording_from if self._recording_from is not None else self._iteration
        self._recording_from = None
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._dir / f"trace_rank{self._rank}_iter{first}-{self._iteration}.json"
        prof.export_chrome_trace(str(path))
        self.traces.append(path)
        where = str(path)
        if self.tensorboard:
            tb_dir = self._dir / "tensorboard"
            tb_dir.mkdir(exist_ok=True)
            # the plugin reads <worker>.<unique>.pt.trace.json files (torch's tensorboard_trace_handler names them so;
            # a profile's results can be exported once, so the Chrome trace is copied under that name)
            shutil.copyfile(path, tb_dir / f"rank{self._rank}.{time.time_ns()}.pt.trace.json")
            where += f" and {tb_dir} (tensorboard --logdir {self._dir})"
        if self._logger is not None:
            self._logger.info(
                f"Profiler: iterations {first}-{self._iteration} traced to {where}; open the JSON in "
                "https://ui.perfetto.dev or chrome://tracing"
            )


def _activity(a: Any) -> Any:
    if isinstance(a, torch.profiler.ProfilerActivity):
        return a
    name = _ACTIVITIES.get(str(a).lower())
    if name is None:
        raise ValueError(
            f"Unknown profiler activity {a!r}; use one of {sorted(_ACTIVITIES)} or a torch.profiler.ProfilerActivity"
        )
    return getattr(torch.profiler.ProfilerActivity, name)
