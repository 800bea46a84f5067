"""A checkpoint is the dict of every stateful piece, by name; resume loads each back.

The trainer's pieces (:func:`stateful_pieces`, in load order): ``model`` and
``optim_wrapper`` (through the strategy, which may shard them), ``param_schedulers``,
``progress`` (epoch, iteration, position in the epoch: the one record of where training
stands), ``train_dataloader`` (only the data-order seed: the loader is positioned from
``progress``), ``metric_store`` (the logged windows), ``hooks`` (by ``state_key``), every
object given to :meth:`Trainer.register_stateful <trainwright.Trainer.register_stateful>`,
and ``rng`` (every global generator; per rank under several processes). ``meta``
(version, time, seed, progress, world size) is written for people and tools.

Three rules keep resume exact and safe:

* **Everything loads with ``weights_only=True``.** :func:`make_safe` checks the finished
  dict (after the ``before_save_checkpoint`` hooks) before it is written: NumPy scalars and
  arrays become Python numbers and tensors, anything else that is not a tensor or a plain
  container is a ``TypeError`` naming its key, at save time rather than at resume time.
* **Nothing is changed before everything is checked.** :func:`restore_state` runs every
  piece's ``check_state_dict`` (model keys and shapes, optimizer class and parameter
  groups, scheduler count) before any ``load_state_dict``; a mismatch names the file.
* **RNG last.** The generators are restored after every other piece and after the
  ``after_load_checkpoint`` hooks, any of which may draw random numbers.

A piece the checkpoint lacks keeps its fresh state, with a warning naming it; only
``optim_wrapper`` and ``param_schedulers`` may be absent silently (a checkpoint saved with
``save_optimizer=False`` / ``save_param_scheduler=False``). Entries of the checkpoint that
no piece claims (e.g. added by a hook) are left to the hooks.
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from trainwright.checkpoint import Stateful, check_state_dict, get_rng_state, set_rng_state
from trainwright.version import __version__

if TYPE_CHECKING:
    from trainwright.data.loader import ResumableLoader
    from trainwright.hooks.dispatch import HookList
    from trainwright.utils.progress import Progress
    from trainwright.strategies.base import Strategy
    from trainwright.trainer.trainer import Trainer

#: Names of the trainer's own pieces (and ``meta``): :meth:`Trainer.register_stateful` refuses them.
BUILTIN_PIECES = ("meta", "model", "optim_wrapper", "param_schedulers", "progress", "train_dataloader", "metric_store", "hooks", "rng")
#: Pieces a checkpoint may lack without a warning (``save_optimizer`` / ``save_param_scheduler=False``).
OPTIONAL_PIECES = frozenset({"optim_wrapper", "param_schedulers"})

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


def _check_model(own: Mapping[str, Any], state: Mapping[str, Any]) -> None:
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


def make_safe(obj: Any, where: str = "checkpoint") -> Any:
    """Return ``obj`` with NumPy values converted; raise if it would not load with ``weights_only=True``.

    Args:
        obj: A checkpoint (or any part of one).
        where: The key path of ``obj``, for the error message.

    Returns:
        ``obj``, or a copy of the containers that held NumPy values.

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



# --------------------------------------------------------------------------- pieces


class ModelState:
    """The model, through the strategy; checks keys and shapes before loading."""

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return self.strategy.model_state_dict()

    def check_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        _check_model(self.strategy.model_state_dict(), state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        self.strategy.load_model_state_dict(state, strict=True)


def _wrappers(optim_wrapper: Any) -> dict[str, Any]:
    """``{name: OptimWrapper}`` of an OptimWrapperDict, ``{"": wrapper}`` of a single wrapper."""
    return dict(optim_wrapper.optim_wrappers) if hasattr(optim_wrapper, "optim_wrappers") else {"": optim_wrapper}


class OptimState:
    """The optim wrapper(s), through the strategy; the saved state names each optimizer's class.

    ``check_state_dict`` refuses a checkpoint whose optimizer class, number of parameter
    groups or parameters per group differ from the trainer's (torch would load some of
    these silently and fail, or train wrongly, later).
    """

    def __init__(self, strategy: Strategy, optim_wrapper: Any) -> None:
        self.strategy = strategy
        self.optim_wrapper = optim_wrapper

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        state = dict(self.strategy.optim_state_dict(self.optim_wrapper))
        for name, ow in _wrappers(self.optim_wrapper).items():
            if name:
                state[name] = {**state[name], "optimizer_class": type(ow.optimizer).__name__}
            else:
                state["optimizer_class"] = type(ow.optimizer).__name__
        return state

    def check_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        for name, ow in _wrappers(self.optim_wrapper).items():
            where = f"optim_wrapper {name!r}" if name else "optimizer"
            saved = state.get(name) if name else state
            if not isinstance(saved, Mapping):
                raise ValueError(f"The checkpoint holds no state for {where}; resume with the same optim_wrapper config")
            own_class, saved_class = type(ow.optimizer).__name__, saved.get("optimizer_class")
            if saved_class is not None and saved_class != own_class:
                raise ValueError(f"The checkpoint's {where} is {saved_class}, the trainer's is {own_class}; resume with the same optim_wrapper config, or use load_from= (weights only) to start a new run")
            groups = [len(g["params"]) for g in saved.get("optimizer", saved).get("param_groups", [])]
            own = [len(g["params"]) for g in ow.optimizer.param_groups]
            if groups != own:
                raise ValueError(
                    f"The checkpoint's {where} has {len(groups)} parameter group(s) of {groups} parameters, the trainer's has {len(own)} of {own}; "
                    "resume with the same optim_wrapper config (param groups) and model, or use load_from= (weights only) to start a new run"
                )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        self.strategy.load_optim_state_dict(self.optim_wrapper, state)


class SchedulerState:
    """The param schedulers (a list, or a dict of lists per optim wrapper); checks their count."""

    def __init__(self, schedulers: Any) -> None:
        self.schedulers = schedulers

    def state_dict(self) -> Any:  # noqa: D102
        return _scheduler_states(self.schedulers)

    def check_state_dict(self, state: Any) -> None:  # noqa: D102
        _check_scheduler_states(self.schedulers, state)

    def load_state_dict(self, state: Any) -> None:  # noqa: D102
        _load_scheduler_states(self.schedulers, state)


class DataOrderState:
    """The train loader's data order: its seed and shape; positioned from :class:`Progress` on load.

    ``progress`` (epoch, iter_in_epoch) is the one record of the position; it is loaded
    before this piece. The seed is kept to warn when a resumed run's data order would
    differ. The shape (``batch_size``, ``dataset_len``, ``drop_last``, ``num_replicas``,
    ``batches``: :meth:`ResumableLoader.shape`) says what the position means: a resume in
    the middle of an epoch with a loader of another shape continues at the same *batch*
    index, which skips or repeats samples of that epoch, so it warns naming both shapes (a
    resume at an epoch end is not affected).
    """

    def __init__(self, loader: ResumableLoader, progress: Progress) -> None:
        self.loader = loader
        self.progress = progress

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"seed": self.loader.seed, "shape": self.loader.shape()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        p = self.progress
        saved, now = state.get("shape"), self.loader.shape()
        if p.iter_in_epoch and isinstance(saved, Mapping) and dict(saved) != now:
            differ = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
            warnings.warn(
                f"Resuming in the middle of epoch {p.epoch + 1} (after batch {p.iter_in_epoch}) with a train_dataloader of another shape: "
                + ", ".join(f"{k} {a} in the checkpoint, {b} now" for k, (a, b) in differ.items())
                + f". The epoch continues at batch {p.iter_in_epoch} of the new loader, so samples of this epoch are skipped or seen twice. "
                "Resume with the same batch_size, dataset, drop_last and number of processes, or from a checkpoint at an epoch end.",
                stacklevel=3,
            )
        self.loader.load_state_dict({"epoch": p.epoch, "position": p.iter_in_epoch, "seed": state.get("seed", self.loader.seed)})


class HookStates:
    """The stateful hooks, as ``{state_key: hook.state_dict()}``; a hook the checkpoint lacks starts fresh, with a warning."""

    def __init__(self, hooks: HookList) -> None:
        self.hooks = {h.state_key: cast(Stateful, h) for h in hooks.stateful()}

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {key: h.state_dict() for key, h in self.hooks.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        for key, h in self.hooks.items():
            if key in state:
                h.load_state_dict(state[key])
            else:
                warnings.warn(f"The checkpoint holds no state for hook {key!r}; it starts fresh", stacklevel=2)


class RngState:
    """Every global random generator; under several processes each rank's own."""

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        rng = get_rng_state()
        if self.strategy.world_size > 1:  # a collective: state_dict() runs on every rank
            return {**rng, "per_rank": list(self.strategy.gather_object(rng))}
        return rng

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        per_rank, rank = state.get("per_rank"), self.strategy.rank
        set_rng_state(per_rank[rank] if per_rank and rank < len(per_rank) else dict(state))


def stateful_pieces(trainer: Trainer, registered: Mapping[str, Stateful]) -> dict[str, Stateful]:
    """The trainer's checkpointed pieces by name, in load order (``progress`` before ``train_dataloader``, ``rng`` last)."""
    strategy = trainer.strategy
    pieces: dict[str, Stateful] = {"model": ModelState(strategy)}
    if trainer.optim_wrapper is not None:
        pieces["optim_wrapper"] = OptimState(strategy, trainer.optim_wrapper)
    if trainer.param_schedulers:
        pieces["param_schedulers"] = SchedulerState(trainer.param_schedulers)
    pieces["progress"] = trainer.progress
    if trainer.train_loop is not None:
        pieces["train_dataloader"] = DataOrderState(trainer.train_loop.dataloader, trainer.progress)
    pieces["metric_store"] = trainer.metric_store
    pieces["hooks"] = HookStates(trainer.hooks)
    pieces.update(registered)
    pieces["rng"] = RngState(strategy)
    return pieces


# --------------------------------------------------------------------------- collect / restore


def collect_state(trainer: Trainer, save_optimizer: bool = True, save_param_scheduler: bool = True) -> dict[str, Any]:
    """``{"meta": ..., name: piece.state_dict() for every piece}``, not yet checked by :func:`make_safe`.

    Called on every rank (collecting may need collectives under sharded strategies); the
    returned tensors may share memory with the live model, so copy them before training
    goes on if they are written later (the async writer does).
    """
    p = trainer.progress
    skip = {name for name, keep in (("optim_wrapper", save_optimizer), ("param_schedulers", save_param_scheduler)) if not keep}
    ckpt: dict[str, Any] = {
        "meta": {
            "trainwright_version": __version__, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "seed": trainer.seed, "epoch": p.epoch,
            "iteration": p.iteration, "world_size": trainer.strategy.world_size, "config": trainer.config,
        },
    }
    for name, piece in trainer.stateful.items():
        if name not in skip:
            ckpt[name] = piece.state_dict()
    return ckpt


def restore_state(trainer: Trainer, ckpt: Mapping[str, Any], path: str | Path) -> None:
    """Load every piece of a :func:`collect_state` checkpoint (read from ``path``) back into the trainer.

    Every piece's check runs before any piece is loaded; RNG states are restored last.

    Raises:
        KeyError: ``ckpt`` has no ``model`` or ``progress`` entry (not a training checkpoint).
        ValueError, RuntimeError: a piece does not fit (the message names ``path``); nothing was changed.
    """
    for key in ("model", "progress"):
        if key not in ckpt:
            raise KeyError(f"Checkpoint {str(path)!r} has no {key!r} entry: it is not a trainwright training checkpoint (keys: {sorted(ckpt)}); use load_from= for weights only")
    pieces = trainer.stateful
    for name, piece in pieces.items():
        if name in ckpt:
            try:
                check_state_dict(piece, ckpt[name])
            except (ValueError, RuntimeError) as e:
                raise type(e)(f"Checkpoint {str(path)!r} does not fit this trainer: {e}") from e
    for name in [n for n in pieces if n not in ckpt and n not in OPTIONAL_PIECES]:
        warnings.warn(f"Checkpoint {str(path)!r} holds no {name!r} state; {name} starts fresh", stacklevel=3)
    saved_seed = ckpt.get("meta", {}).get("seed")
    if isinstance(saved_seed, int) and saved_seed != trainer.seed and not trainer.seed_given:
        trainer.adopt_seed(saved_seed)  # no seed given: continue the checkpoint's data order (mmengine semantics)
    saved_world = int(ckpt.get("meta", {}).get("world_size", 1))
    if saved_world != trainer.strategy.world_size:
        trainer.logger.warning(f"Checkpoint was written by {saved_world} process(es), this run has {trainer.strategy.world_size}: the data order and random streams will differ from the original run")

    rng = pieces.pop("rng")
    for name, piece in pieces.items():
        if name in ckpt:
            piece.load_state_dict(ckpt[name])
    trainer.hooks.call("after_load_checkpoint", trainer, ckpt)
    if "rng" in ckpt:
        rng.load_state_dict(ckpt["rng"])
