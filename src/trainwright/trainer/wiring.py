"""What the Trainer's constructor wires around the model: the checks of its arguments before anything is created, the
run's logging (logger, writers, metric store and its agreement, log lines; the hook timing table) and the spike guard's
run."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from trainwright.hooks.dispatch import HookList
from trainwright.hooks.hook import Hook
from trainwright.logging.agreement import Agreement
from trainwright.logging.lines import PendingLines
from trainwright.logging.logger import create_logger
from trainwright.logging.metric_store import MetricStore
from trainwright.logging.writers import AnyAhead, Writer, Writers, build_writers
from trainwright.optim.spike_guard import SpikeGuard
from trainwright.registry import check_keys
from trainwright.strategies.base import Strategy
from trainwright.trainer.build import EVAL_CFG_KEYS, TRAIN_CFG_KEYS
from trainwright.utils.progress import Progress


def checked_cfgs(
    nonfinite_loss: str, writers_fail: str, *cfgs: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``train_cfg``, ``val_cfg`` and ``test_cfg`` as dicts, each key checked, and ``nonfinite_loss`` /
    ``writers_fail`` checked: a ValueError / TypeError naming the argument before anything is created."""
    if nonfinite_loss not in ("raise", "skip"):
        raise ValueError(f"nonfinite_loss must be 'raise' or 'skip', got {nonfinite_loss!r}")
    Writers(fail=writers_fail)  # checks the value
    train, val, test = (dict(c or {}) for c in cfgs)
    for key, cfg, allowed in (("train_cfg", train, TRAIN_CFG_KEYS), ("val_cfg", val, EVAL_CFG_KEYS)):
        check_keys(key, cfg, allowed)
    check_keys("test_cfg", test, EVAL_CFG_KEYS)
    return train, val, test


class RunLogging(NamedTuple):
    """The run's logging, as the Trainer holds it (the writers are ``log_lines.writers``)."""

    logger: logging.Logger
    metric_store: MetricStore
    log_lines: PendingLines


def build_logging(
    strategy: Strategy,
    run_dir: Path,
    log_level: str | int,
    writers: Sequence[Writer | str | Mapping[str, Any]] | None,
    writers_fail: str,
    hooks: Sequence[Hook],
    nonfinite_loss: str,
) -> RunLogging:
    """The logger (``run_dir/train.log`` on the main process), the writers (only the main process has any: THE rank
    decision of logging; the hooks' own writers join), the metric store with the run's agreement (one collective per
    flush under several processes) and the log lines over them; the environment and seed are logged."""
    main = strategy.is_main_process
    logger = create_logger(log_file=run_dir / "train.log" if main else None, level=log_level, rank=strategy.rank)
    fan_out = Writers(
        build_writers(writers, run_dir, logger, hooks) if main else [], logger, writers_fail, AnyAhead(hooks)
    )
    logger.info(f"Environment: {strategy.collect_env()}")
    logger.info(f"Random seed: {strategy.seed}")
    agreement = Agreement(strategy.all_gather if strategy.world_size > 1 else None)
    store = MetricStore(raise_on_nonfinite=nonfinite_loss == "raise", agreement=agreement)
    return RunLogging(logger, store, PendingLines(store, fan_out, strategy.data_parallel_size))


def add_spike_guard(
    guard: SpikeGuard | None, hooks: HookList, progress: Progress, logs: RunLogging, strategy: Strategy
) -> None:
    """Give the spike guard (``Trainer(spike_guard=...)``) the run it judges and add its hook; nothing for None."""
    if guard is None:
        return
    from trainwright.hooks.spike_guard import SpikeGuardHook

    gather = strategy.all_gather if strategy.world_size > 1 else None
    guard.attach(progress=progress, logger=logs.logger, metric_store=logs.metric_store, gather=gather)
    hooks.add(SpikeGuardHook(guard))


def log_hook_table(hooks: HookList, logger: logging.Logger, hook_timing: bool | None) -> None:
    """Log the hook timing table after ``train()`` (``Trainer(hook_timing=...)``): at INFO for True, DEBUG for None
    (so only with ``log_level="DEBUG"``), never for False (the hooks are not timed)."""
    level = logging.INFO if hook_timing else logging.DEBUG
    if hooks.timer is not None and logger.isEnabledFor(level):
        logger.log(
            level, f"Time spent in hooks (calls and seconds per event, since the trainer was built):\n{hooks.report()}"
        )
