"""A checkpoint is the dict of every stateful piece, by name; resume loads each back.

Pieces (keys of the dict): ``meta``, ``model``, ``optim_wrapper`` (optimizer, accumulation
counter, partial gradients of an unfinished window, GradScaler), ``param_schedulers``,
``progress`` (epoch, iteration, position in the epoch), ``train_dataloader`` (epoch and
position of the data order), ``hooks`` (by ``state_key``), ``metric_store`` (the logged
windows) and ``rng`` (every global generator; ``rng_per_rank`` too under several processes).

Two rules keep resume exact and safe:

* **Everything loads with ``weights_only=True``.** :func:`collect_state` checks the dict
  before it is written: NumPy scalars and arrays are turned into Python numbers and
  tensors, anything else that is not a tensor or a plain container is an error naming
  its key, at save time rather than at resume time.
* **Nothing is changed before everything is checked.** :func:`restore_state` validates
  the model keys and shapes and the scheduler count first, so a checkpoint that does not
  fit leaves the trainer untouched; the RNG states are restored last, after every other
  piece (some of which may draw random numbers while loading).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trainwright.checkpoint.rng import get_rng_state, set_rng_state
from trainwright.version import __version__

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer

_PLAIN = (str, int, float, bool, bytes, type(None), torch.dtype, torch.device, torch.Size)


def _is_plain(obj: Any) -> bool:
    # exact types: an IntEnum or a str subclass pickles as its class, which the safe loader refuses
    return type(obj) in _PLAIN


def _scheduler_states(schedulers: Any) -> Any:
    if isinstance(schedulers, dict):
        return {k: _scheduler_states(v) for k, v in schedulers.items()}
    return [s.state_dict() for s in schedulers or []]


def _check_scheduler_states(schedulers: Any, states: Any) -> None:
    if isinstance(schedulers, dict):
        if not isinstance(states, Mapping) or set(states) != set(schedulers):
            raise ValueError(f"Checkpoint param schedulers {sorted(states) if isinstance(states, Mapping) else type(states).__name__} do not match the trainer's {sorted(schedulers)}; resume with the same param_scheduler config")
        for k, v in schedulers.items():
            _check_scheduler_states(v, states[k])
        return
    schedulers = schedulers or []
    if len(states) != len(schedulers):
        raise ValueError(f"Checkpoint holds {len(states)} param schedulers but the trainer has {len(schedulers)}; resume with the same param_scheduler config")


def _load_scheduler_states(schedulers: Any, states: Any) -> None:
    if isinstance(schedulers, dict):
        for k, v in schedulers.items():
            _load_scheduler_states(v, states[k])
        return
    for s, st in zip(schedulers or [], states):
        s.load_state_dict(st)


def make_safe(obj: Any, where: str = "checkpoint") -> Any:
    """Return ``obj`` with NumPy values converted; raise if it would not load with ``weights_only=True``.

    Args:
        obj: A checkpoint (or any part of one).
        where: The key path of ``obj``, for the error message.

    Raises:
        TypeError: ``obj`` holds an object the safe loader refuses (names its key path).
    """
    if isinstance(obj, torch.Tensor) or _is_plain(obj):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, Mapping):
        pairs = [(k, v, make_safe(v, f"{where}[{k!r}]")) for k, v in obj.items()]
        for k, _, _ in pairs:
            if not _is_plain(k):
                raise TypeError(f"{where} has a key of type {type(k).__name__} ({k!r}); checkpoint dict keys must be strings or numbers")
        if all(new is old for _, old, new in pairs) and type(obj) in (dict, OrderedDict):
            return obj  # unchanged: keep the object (and e.g. a state dict's _metadata)
        return OrderedDict((k, new) for k, _, new in pairs) if isinstance(obj, OrderedDict) else {k: new for k, _, new in pairs}
    if isinstance(obj, (list, tuple)):
        items = [make_safe(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if all(a is b for a, b in zip(items, obj)) and type(obj) in (list, tuple):
            return obj
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, (set, frozenset)) and all(_is_plain(v) for v in obj):
        return obj
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, which a checkpoint cannot hold: "
        "checkpoints are loaded with torch.load(weights_only=True), which only rebuilds tensors and plain "
        "containers. Make the state_dict() that returns it store tensors, numbers, strings, lists and dicts instead."
    )


def collect_state(trainer: Trainer, save_optimizer: bool = True, save_param_scheduler: bool = True) -> dict[str, Any]:
    """Everything needed to continue the run exactly, as plain tensors and containers.

    Called on every rank (collecting may need collectives under sharded strategies); the
    returned tensors may share memory with the live model, so copy them before training
    goes on if they are written later (the async writer does).
    """
    strategy = trainer.strategy
    rng = get_rng_state()
    ckpt: dict[str, Any] = {
        "meta": {"trainwright_version": __version__, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "seed": trainer.seed, "epoch": trainer.progress.epoch, "iteration": trainer.progress.iteration, "world_size": strategy.world_size},
        "model": strategy.model_state_dict(),
        "progress": trainer.progress.state_dict(),
        "metric_store": trainer.metric_store.state_dict(),
        "rng": rng,
        "hooks": {h.state_key: h.state_dict() for h in trainer.hooks.stateful()},
    }
    if strategy.world_size > 1:
        ckpt["rng_per_rank"] = list(strategy.gather_object(rng))
    if trainer.train_loop is not None:
        ckpt["train_dataloader"] = trainer.train_loop.dataloader.state_dict()
    if save_optimizer and trainer.optim_wrapper is not None:
        ckpt["optim_wrapper"] = trainer.optim_wrapper.state_dict()
    if save_param_scheduler and trainer.param_schedulers:
        ckpt["param_schedulers"] = _scheduler_states(trainer.param_schedulers)
    return make_safe(ckpt)  # type: ignore[no-any-return]


def _check_model(trainer: Trainer, state: Mapping[str, Any]) -> None:
    own = trainer.strategy.model_state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"size mismatch for {k}: copying a param with shape {tuple(state[k].shape)} from checkpoint, the shape in current model is {tuple(v.shape)}."
        for k, v in own.items()
        if k in state and isinstance(v, torch.Tensor) and isinstance(state[k], torch.Tensor) and v.shape != state[k].shape
    ]
    if missing or unexpected or shapes:
        lines = ([f"missing keys: {missing}"] if missing else []) + ([f"unexpected keys: {unexpected}"] if unexpected else []) + shapes
        raise RuntimeError(
            "The checkpoint's model does not match the trainer's model, nothing was loaded:\n  " + "\n  ".join(lines)
            + "\nResume with the same model definition, or use load_from= (weights only, strict=False) to start a new run from these weights."
        )


def restore_state(trainer: Trainer, ckpt: dict[str, Any], resume_optimizer: bool = True, resume_param_scheduler: bool = True) -> None:
    """Load every piece of a :func:`collect_state` checkpoint back into the trainer.

    Everything that can be checked is checked before anything is changed; RNG states are
    restored last so that nothing loaded afterwards can move them.
    """
    for key in ("model", "progress"):
        if key not in ckpt:
            raise KeyError(f"Checkpoint has no {key!r} entry: it is not a trainwright training checkpoint (keys: {sorted(ckpt)}); use load_from= for weights only")
    _check_model(trainer, ckpt["model"])
    if resume_param_scheduler and "param_schedulers" in ckpt and trainer.param_schedulers:
        _check_scheduler_states(trainer.param_schedulers, ckpt["param_schedulers"])
    saved_world = int(ckpt.get("meta", {}).get("world_size", 1))
    if saved_world != trainer.strategy.world_size:
        trainer.logger.warning(f"Checkpoint was written by {saved_world} process(es), this run has {trainer.strategy.world_size}: the data order and random streams will differ from the original run")

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
    trainer.hooks.call("after_load_checkpoint", trainer, ckpt)
    per_rank = ckpt.get("rng_per_rank")
    rank = trainer.strategy.rank
    rng = per_rank[rank] if per_rank and rank < len(per_rank) else ckpt.get("rng")
    if rng is not None:
        set_rng_state(rng)
