"""Default hooks and how ``default_hooks`` / ``custom_hooks`` configure them."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from trainwright.hooks.hook import Hook, get_priority, require_hook
from trainwright.loops.train_loop import ITER_VAL_INTERVAL
from trainwright.registry import HOOKS, did_you_mean
from trainwright.trainer.build import train_by_epoch

#: The stock hooks a trainer has unless switched off by name (value None).
DEFAULT_HOOKS: dict[str, dict[str, Any]] = {
    "runtime_info": dict(type="RuntimeInfoHook"),
    "timer": dict(type="IterTimerHook"),
    "logger": dict(type="LoggerHook", interval=10),
    "flops": dict(type="FlopsHook"),
    "param_scheduler": dict(type="ParamSchedulerHook"),
    "checkpoint": dict(type="CheckpointHook", interval=1, by_epoch=True),
    "sampler_seed": dict(type="DistSamplerSeedHook"),
    "preemption": dict(type="PreemptionHook"),
    "progress_bar": dict(type="ProgressBarHook"),
    "stall": dict(type="StallHook"),
}

#: Stock hooks a trainer has only when named in ``default_hooks`` (``dict(norms=dict(interval=100))``).
OPTIONAL_HOOKS: dict[str, dict[str, Any]] = {
    "norms": dict(type="NormsHook"),
}


def stock_hooks(train_cfg: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The stock hooks' configs for a run of ``train_cfg``: :data:`DEFAULT_HOOKS`, the checkpoint hook in the train
    loop's unit.

    An iteration-based loop (``by_epoch=False``) gets a checkpoint hook that counts iterations
    and saves as often as the loop validates (``val_interval``; 1000 by default, mmengine's),
    so its checkpoints hold the scores of that validation, as an epoch-based run's do. User
    settings are merged over these: an explicit ``by_epoch`` is kept.
    """
    stock = {k: dict(v) for k, v in DEFAULT_HOOKS.items()}
    if train_cfg is not None and not train_by_epoch(train_cfg):
        stock["checkpoint"] = dict(
            type="CheckpointHook", interval=int(train_cfg.get("val_interval", ITER_VAL_INTERVAL)), by_epoch=False
        )
    return stock


def build_hooks(
    default_hooks: Mapping[str, Any] | None,
    custom_hooks: Sequence[Any] | None,
    train_cfg: Mapping[str, Any] | None = None,
) -> list[Hook]:
    """Merge user settings into the stock hooks and build everything.

    ``default_hooks`` maps a stock name to: a dict of arguments (merged into the default;
    with ``type`` it replaces the hook), a Hook object, or None (disabled). The names of
    :data:`OPTIONAL_HOOKS` are off until given a dict (``norms=dict()``: its defaults). Unknown names
    are added as extra hooks only if they carry a ``type``. ``train_cfg`` (the Trainer's) puts
    the default checkpoint hook in the loop's unit (see :func:`stock_hooks`).
    """
    merged: dict[str, Any] = stock_hooks(train_cfg)
    for name, value in (default_hooks or {}).items():
        if value is None or isinstance(value, Hook):
            merged[name] = value
        elif isinstance(value, Mapping):
            if name in merged and merged[name] is not None and "type" not in value:
                merged[name] = {**merged[name], **value}
            elif name in OPTIONAL_HOOKS and "type" not in value:  # switched on by naming it
                merged[name] = {**OPTIONAL_HOOKS[name], **value}
            elif "type" in value:
                merged[name] = dict(value)
            else:
                raise KeyError(
                    f"Unknown default hook {name!r}.{did_you_mean(name, [*DEFAULT_HOOKS, *OPTIONAL_HOOKS])} Stock "
                    f"hooks: {list(DEFAULT_HOOKS)}, off unless named: {list(OPTIONAL_HOOKS)}; to add another hook give "
                    "it a 'type' or use custom_hooks"
                )
        else:
            raise TypeError(f"default_hooks[{name!r}] must be a dict, a Hook or None, got {type(value).__name__}")
    hooks = [build_hook(v) for v in merged.values() if v is not None]
    for h in custom_hooks or []:
        hooks.append(build_hook(h))
    return hooks


def build_hook(cfg: Hook | Mapping[str, Any], priority: int | str | None = None) -> Hook:
    """A hook from a Hook object or a dict with ``type`` (and, as in mmengine, an optional ``priority``).

    ``priority`` (the argument, else the dict's ``priority`` key) replaces the hook's own, on this
    instance only.
    """
    if isinstance(cfg, Mapping) and "priority" in cfg:
        cfg = dict(cfg)
        given = cfg.pop("priority")
        priority = given if priority is None else priority
    hook = require_hook(HOOKS.build(cfg))
    if priority is not None:
        get_priority(priority)  # a clear error for a bad value, now rather than when sorting
        hook.priority = priority  # type: ignore[misc]
    return hook


def check_one_average(hooks: Sequence[Hook] | Any) -> None:
    """Refuse ``SWAHook`` with ``EMAHook``: both put averaged weights into the model for evaluation, and they would
    disagree.

    With both, the validations and a later ``test()`` would evaluate the EMA while the model
    and its checkpoint hold the SWA average; which weights a number belongs to would be a guess.
    """
    # a hook of a class whose module is not loaded cannot exist: a run without them loads neither
    swa, ema = sys.modules.get("trainwright.hooks.swa"), sys.modules.get("trainwright.hooks.ema")
    if swa is None or ema is None:
        return
    if any(isinstance(h, swa.SWAHook) for h in hooks) and any(isinstance(h, ema.EMAHook) for h in hooks):
        raise ValueError(
            "SWAHook and EMAHook in one run: both swap averaged weights into the model for evaluation, so the "
            "validations would report "
            "the EMA's weights while the model and the final checkpoint hold the SWA average; keep one (SWAHook: the "
            "average of the "
            "epoch-end weights from begin_epoch on, with its own lr schedule; EMAHook: a running average of every step)"
        )
