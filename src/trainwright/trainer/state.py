"""A checkpoint is the dict of every stateful piece, by name; resume loads each back."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from trainwright.checkpoint.rng import get_rng_state, set_rng_state
from trainwright.version import __version__

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer


def _scheduler_states(schedulers: Any) -> Any:
    if isinstance(schedulers, dict):
        return {k: _scheduler_states(v) for k, v in schedulers.items()}
    return [s.state_dict() for s in schedulers or []]


def _load_scheduler_states(schedulers: Any, states: Any) -> None:
    if isinstance(schedulers, dict):
        for k, v in schedulers.items():
            _load_scheduler_states(v, states[k])
        return
    schedulers = schedulers or []
    if len(states) != len(schedulers):
        raise ValueError(f"Checkpoint holds {len(states)} param schedulers but the trainer has {len(schedulers)}; resume with the same param_scheduler config")
    for s, st in zip(schedulers, states):
        s.load_state_dict(st)


def collect_state(trainer: Trainer, save_optimizer: bool = True, save_param_scheduler: bool = True) -> dict[str, Any]:
    """Everything needed to continue the run exactly, as plain tensors and containers."""
    ckpt: dict[str, Any] = {
        "meta": {"trainwright_version": __version__, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "seed": trainer.seed, "epoch": trainer.progress.epoch, "iteration": trainer.progress.iteration},
        "model": trainer.strategy.model_state_dict(),
        "progress": trainer.progress.state_dict(),
        "metric_store": trainer.metric_store.state_dict(),
        "rng": get_rng_state(),
        "hooks": {h.state_key: h.state_dict() for h in trainer.hooks.stateful()},
    }
    if trainer.train_loop is not None:
        ckpt["train_dataloader"] = trainer.train_loop.dataloader.state_dict()
    if save_optimizer and trainer.optim_wrapper is not None:
        ckpt["optim_wrapper"] = trainer.optim_wrapper.state_dict()
    if save_param_scheduler and trainer.param_schedulers:
        ckpt["param_schedulers"] = _scheduler_states(trainer.param_schedulers)
    return ckpt


def restore_state(trainer: Trainer, ckpt: dict[str, Any], resume_optimizer: bool = True, resume_param_scheduler: bool = True) -> None:
    """Load every piece of a :func:`collect_state` checkpoint back into the trainer."""
    for key in ("model", "progress"):
        if key not in ckpt:
            raise KeyError(f"Checkpoint has no {key!r} entry: it is not a trainwright training checkpoint (keys: {sorted(ckpt)}); use load_from= for weights only")
    trainer.strategy.load_model_state_dict(ckpt["model"], strict=True)
    trainer.progress.load_state_dict(ckpt["progress"])
    if "metric_store" in ckpt:
        trainer.metric_store.load_state_dict(ckpt["metric_store"])
    if resume_optimizer and "optim_wrapper" in ckpt and trainer.optim_wrapper is not None:
        trainer.optim_wrapper.load_state_dict(ckpt["optim_wrapper"])
    if resume_param_scheduler and "param_schedulers" in ckpt and trainer.param_schedulers:
        _load_scheduler_states(trainer.param_schedulers, ckpt["param_schedulers"])
    if trainer.train_loop is not None and "train_dataloader" in ckpt:
        trainer.train_loop.dataloader.load_state_dict(ckpt["train_dataloader"])
    hook_states = ckpt.get("hooks", {})
    for h in trainer.hooks.stateful():
        if h.state_key in hook_states:
            h.load_state_dict(hook_states[h.state_key])
    if "rng" in ckpt:
        set_rng_state(ckpt["rng"])
    trainer.hooks.call("after_load_checkpoint", trainer, ckpt)
