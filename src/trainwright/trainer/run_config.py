"""The Trainer's settings as plain values: written to the writers and into every checkpoint's ``meta``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainwright.logging.writers import plain
from trainwright.strategies.base import Strategy

#: The Trainer arguments its config records, in the order written (``spike_guard`` / ``checkpoint`` only when given);
#: ``strategy``, ``world_size`` and ``seed`` are the strategy's, after ``precision``.
RECORDED: tuple[str, ...] = (
    "work_dir",
    "experiment_name",
    "train_cfg",
    "val_cfg",
    "test_cfg",
    "optim_wrapper",
    "param_scheduler",
    "default_hooks",
    "custom_hooks",
    "precision",
    "strategy",
    "world_size",
    "seed",
    "randomness",
    "compile",
    "activation_checkpointing",
    "resume",
    "load_from",
    "nonfinite_loss",
    "spike_guard",
    "checkpoint",
)
_CFGS = ("train_cfg", "val_cfg", "test_cfg")
_IF_GIVEN = ("spike_guard", "checkpoint")


def run_config(args: Mapping[str, Any], name: str, strategy: Strategy) -> dict[str, Any]:
    """The config of a Trainer built with ``args`` (its constructor's arguments by name) under ``strategy``, in the
    run folder ``name``."""
    facts = {
        "work_dir": Path(args["work_dir"]),
        "experiment_name": name,
        "strategy": strategy.name,
        "world_size": strategy.world_size,
        "seed": strategy.seed,
        **{k: dict(args[k] or {}) for k in _CFGS},
    }
    config = {k: facts[k] if k in facts else args[k] for k in RECORDED if not (k in _IF_GIVEN and args[k] is None)}
    return plain(config)  # type: ignore[no-any-return]
