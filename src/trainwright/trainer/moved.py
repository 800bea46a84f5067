"""Trainer members that moved to the object that owns them; the old spellings keep working, with a DeprecationWarning.

The Trainer builds, wires and delegates: its checkpoint conveniences are the checkpoint
manager's (``trainer.checkpoints``), process facts the strategy's, the hook timing table the
hook list's. ``Trainer.__getattr__`` answers the old names from :data:`MOVED`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _excluded(save_optimizer: bool, save_param_scheduler: bool) -> tuple[str, ...]:
    return ("optim_wrapper",) * (not save_optimizer) + ("param_schedulers",) * (not save_param_scheduler)


def _state_dict(t: Any) -> Callable[..., dict[str, Any]]:
    def state_dict(save_optimizer: bool = True, save_param_scheduler: bool = True) -> dict[str, Any]:
        return t.checkpoints.state_dict(_excluded(save_optimizer, save_param_scheduler))

    return state_dict


def _save_checkpoint(t: Any) -> Callable[..., Any]:
    def save_checkpoint(
        path: str | Path,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        *,
        async_save: bool = False,
        after: Callable[[], None] | None = None,
    ) -> Any:
        return t.checkpoints.save(
            path, exclude=_excluded(save_optimizer, save_param_scheduler), async_save=async_save, after=after
        )

    return save_checkpoint


def _spike_guard(t: Any) -> Any:
    from trainwright.hooks.spike_guard import SpikeGuardHook

    return next((h.guard for h in t.hooks if isinstance(h, SpikeGuardHook)), None)


#: Old name -> (where it lives now, how to read it from a trainer).
MOVED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "is_main_process": ("trainer.strategy.is_main_process", lambda t: t.strategy.is_main_process),
    "seed": ("trainer.strategy.seed", lambda t: t.strategy.seed),
    "max_iters": ("trainer.train_loop.max_iters", lambda t: t.train_loop.max_iters if t.train_loop is not None else 0),
    "ckpt_dir": ("trainer.checkpoints.ckpt_dir", lambda t: t.checkpoints.ckpt_dir),
    "stateful": ("trainer.checkpoints.stateful", lambda t: t.checkpoints.stateful),
    "register_stateful": ("trainer.checkpoints.add(name, obj)", lambda t: t.checkpoints.add),
    "request_checkpoint": ("trainer.checkpoints.save_now()", lambda t: t.checkpoints.save_now),
    "state_dict": ("trainer.checkpoints.state_dict(exclude)", _state_dict),
    "save_checkpoint": ("trainer.checkpoints.save(path, exclude=...)", _save_checkpoint),
    "hook_report": ("trainer.hooks.report()", lambda t: t.hooks.report),
    "work_dir": ("trainer.config['work_dir']", lambda t: Path(t.config["work_dir"])),
    "experiment_name": ("trainer.run_dir.name", lambda t: t.run_dir.name),
    "train_cfg": ("trainer.config['train_cfg']", lambda t: t.config["train_cfg"]),
    "val_cfg": ("trainer.config['val_cfg']", lambda t: t.config["val_cfg"]),
    "test_cfg": ("trainer.config['test_cfg']", lambda t: t.config["test_cfg"]),
    "nonfinite_loss": ("trainer.config['nonfinite_loss']", lambda t: t.config["nonfinite_loss"]),
    "agreement": ("trainer.metric_store.agreement", lambda t: t.metric_store.agreement),
    "writers": ("trainer.log_lines.writers", lambda t: t.log_lines.writers),
    "spike_guard": ("trainer.hooks (its SpikeGuardHook's guard)", _spike_guard),
    "preempted": (
        "trainer.train_loop.control.preempted",
        lambda t: bool(t.train_loop is not None and t.train_loop.ctx is not None and t.train_loop.control.preempted),
    ),
}


def moved_member(trainer: Any, name: str) -> Any:
    """``trainer.<name>`` for a member that moved (a DeprecationWarning names its new place); AttributeError for any
    other name."""
    entry = MOVED.get(name)
    if entry is None:
        raise AttributeError(f"'{type(trainer).__name__}' object has no attribute {name!r}")
    new, read = entry
    warnings.warn(
        f"trainer.{name} moved to {new}; the old spelling will be removed in a later release",
        DeprecationWarning,
        stacklevel=3,
    )
    return read(trainer)


def set_should_stop(value: bool, loop: Any, agreement: Any) -> None:
    """``trainer.should_stop = value``, the deprecated spelling (Lightning's, mmengine users') of
    ``trainer.train_loop.control.request_stop(reason)``: that while ``loop`` trains, else (a val() / test() pass, or a
    request withdrawn) the run's ``agreement`` finish flag."""
    warnings.warn(
        "trainer.should_stop = True is deprecated: call trainer.train_loop.control.request_stop(reason)",
        DeprecationWarning,
        stacklevel=3,
    )
    if value and loop is not None and loop.ctx is not None:
        loop.control.request_stop("trainer.should_stop = True")
    else:
        agreement.request_finish(value)
