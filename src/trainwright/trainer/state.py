"""The trainer's checkpoint pieces: what each part of a run saves, checks and loads back.

``meta`` (trainwright, torch and format versions, time, seed, progress, world size, settings; on load: seed adoption),
``model`` and ``optim_wrapper`` (through the strategy, which may shard them),
``param_schedulers``, ``train_dataloader`` (the data order; positioned from ``progress``),
``data_state`` (a stream's own position: :class:`~trainwright.data.stream_state.StreamState`) and ``hooks`` (by
``state_key``). Their checks refuse a checkpoint that does not fit before anything loads. The
:class:`~trainwright.checkpoint.manager.CheckpointManager` saves and restores the mapping the Trainer builds of them
(see docs/checkpoints.md).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import torch

from trainwright.checkpoint import Stateful
from trainwright.checkpoint.migrate import FORMAT_VERSION
from trainwright.checkpoint.stateful import PieceNotReady
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.optim.window_state import gather_windows, own_window
from trainwright.version import __version__

if TYPE_CHECKING:
    from trainwright.data.loader import ResumableLoader
    from trainwright.hooks.dispatch import HookList
    from trainwright.strategies.base import Strategy
    from trainwright.trainer.seeding import RunSeed
    from trainwright.utils.progress import Progress

#: The trainer's own piece names, in load order (``rng`` follows, appended by the manager).
PIECES = (
    "meta",
    "model",
    "optim_wrapper",
    "param_schedulers",
    "progress",
    "train_dataloader",
    "data_state",
    "metric_store",
    "hooks",
)
#: Pieces a checkpoint may lack without a warning (``save_optimizer`` / ``save_param_scheduler=False``).
OPTIONAL_PIECES = ("meta", "optim_wrapper", "param_schedulers", "message_hub", "data_state")


def _scheduler_states(schedulers: Any) -> Any:
    if isinstance(schedulers, dict):
        return {k: _scheduler_states(v) for k, v in schedulers.items()}
    return [s.state_dict() for s in schedulers or []]


def _scheduler_pairs(schedulers: Any, states: Any) -> list[tuple[Any, Any]]:
    """``(scheduler, its saved state)`` of every scheduler; a ValueError when the checkpoint holds other schedulers."""
    if isinstance(schedulers, dict):
        if not isinstance(states, Mapping) or set(states) != set(schedulers):
            raise ValueError(
                "Checkpoint param schedulers "
                f"{sorted(states) if isinstance(states, Mapping) else type(states).__name__} do not match the "
                f"trainer's {sorted(schedulers)}; resume with the same param_scheduler config"
            )
        return [pair for k, v in schedulers.items() for pair in _scheduler_pairs(v, states[k])]
    schedulers = schedulers or []
    if len(states) != len(schedulers):
        raise ValueError(
            f"Checkpoint holds {len(states)} param schedulers but the trainer has {len(schedulers)}; resume with the "
            "same param_scheduler config"
        )
    return list(zip(schedulers, states))


def _check_model(own: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"size mismatch for {k}: copying a param with shape {tuple(state[k].shape)} from checkpoint, the shape in "
        f"current model is {tuple(v.shape)}."
        for k, v in own.items()
        if k in state
        and isinstance(v, torch.Tensor)
        and isinstance(state[k], torch.Tensor)
        and v.shape != state[k].shape
    ]
    if missing or unexpected or shapes:
        lines = (
            ([f"missing keys: {missing}"] if missing else [])
            + ([f"unexpected keys: {unexpected}"] if unexpected else [])
            + shapes
        )
        raise RuntimeError(
            "The checkpoint's model does not match the trainer's model, nothing was loaded:\n  "
            + "\n  ".join(lines)
            + "\nResume with the same model definition, or use load_from= (weights only, strict=False) to start a "
            "new run from these weights."
        )


# --------------------------------------------------------------------------- pieces


class ModelState:
    """The model, through the strategy; checks keys and shapes before loading."""

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return self.strategy.model_state_dict()

    def check_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        if self.strategy.model is None:
            raise PieceNotReady(
                "this trainer's model is not prepared yet (the strategy moves and wraps it when train(), val() or "
                "test() first runs, or in trainer.build_train_loop())"
            )
        _check_model(self.strategy.model_state_dict(), state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        self.strategy.load_model_state_dict(state, strict=True)


class OptimState:
    """The optim wrapper(s), through the strategy; the saved state names each optimizer's class.

    ``check_state_dict`` refuses a checkpoint whose optimizer class, number of parameter
    groups or parameters per group differ from the trainer's (torch would load some of
    these silently and fail, or train wrongly, later). Saved inside an accumulation window under several processes,
    every rank's partial gradients are gathered (``window_per_rank``, a collective) and each rank resumes its own
    (:mod:`trainwright.optim.window_state`).
    """

    def __init__(self, strategy: Strategy, optim_wrapper: Any) -> None:
        self.strategy = strategy
        self.optim_wrapper = optim_wrapper

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        state = dict(self.strategy.optim_state_dict(self.optim_wrapper))
        for name, ow in optim_wrappers_of(self.optim_wrapper).items():
            if name:
                state[name] = {**state[name], "optimizer_class": type(ow.optimizer).__name__}
            else:
                state["optimizer_class"] = type(ow.optimizer).__name__
        return gather_windows(state, self.optim_wrapper, self.strategy.gather_object, self.strategy.world_size)

    def check_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        for name, ow in optim_wrappers_of(self.optim_wrapper).items():
            where = f"optim_wrapper {name!r}" if name else "optimizer"
            saved = state.get(name) if name else state
            if not isinstance(saved, Mapping):
                raise ValueError(
                    f"The checkpoint holds no state for {where}; resume with the same optim_wrapper config"
                )
            own_class, saved_class = type(ow.optimizer).__name__, saved.get("optimizer_class")
            if saved_class is not None and saved_class != own_class:
                raise ValueError(
                    f"The checkpoint's {where} is {saved_class}, the trainer's is {own_class}; resume with the same "
                    "optim_wrapper config, or use load_from= (weights only) to start a new run"
                )
            groups = [len(g["params"]) for g in saved.get("optimizer", saved).get("param_groups", [])]
            own = [len(g["params"]) for g in ow.optimizer.param_groups]
            if groups != own:
                raise ValueError(
                    f"The checkpoint's {where} has {len(groups)} parameter group(s) of {groups} parameters, the "
                    f"trainer's has {len(own)} of {own}; "
                    "resume with the same optim_wrapper config (param groups) and model, or use load_from= (weights "
                    "only) to start a new run"
                )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        own = own_window(state, self.optim_wrapper, self.strategy.rank, self.strategy.world_size)
        self.strategy.load_optim_state_dict(self.optim_wrapper, own)


class SchedulerState:
    """The param schedulers (a list, or a dict of lists per optim wrapper); checks their count."""

    def __init__(self, schedulers: Any) -> None:
        self.schedulers = schedulers

    def state_dict(self) -> Any:  # noqa: D102
        return _scheduler_states(self.schedulers)

    def check_state_dict(self, state: Any) -> None:  # noqa: D102
        _scheduler_pairs(self.schedulers, state)

    def load_state_dict(self, state: Any) -> None:  # noqa: D102
        for scheduler, saved in _scheduler_pairs(self.schedulers, state):
            scheduler.load_state_dict(saved)


class DataOrderState:
    """The train loader's data order: its seed and shape; positioned from :class:`Progress` on load.

    ``progress`` (epoch, iter_in_epoch) is the one record of the position; it is loaded
    before this piece. The seed is kept to warn when a resumed run's data order would
    differ. The shape (``batch_size``, ``dataset_len``, ``drop_last``, ``num_replicas``,
    ``batches``: :meth:`ResumableLoader.shape`) says what the position means: a resume in
    the middle of an epoch with a loader of another shape continues at the same *batch*
    index, which skips or repeats samples of that epoch, so it warns naming both shapes (a
    resume at an epoch end is not affected). The warning goes to ``logger`` (the trainer's:
    ``train.log``), else through :mod:`warnings`.
    """

    def __init__(self, loader: ResumableLoader, progress: Progress, logger: logging.Logger | None = None) -> None:
        self.loader = loader
        self.progress = progress
        self.logger = logger
        #: How the loader restored last differs from the checkpoint's (``"batch_size 2 in the checkpoint, 4 now"``),
        #: when the checkpoint was written mid-epoch; None otherwise. Named when nothing is left to train.
        self.shape_change: str | None = None

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {"seed": self.loader.seed, "shape": self.loader.shape()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        p = self.progress
        saved, now = state["shape"], self.loader.shape()
        self.shape_change = None
        if p.iter_in_epoch and dict(saved) != now:
            differ = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
            self.shape_change = ", ".join(f"{k} {a} in the checkpoint, {b} now" for k, (a, b) in differ.items())
            batches = now.get("batches")
            follows = (
                f"The new loader has {batches} batches per epoch, so epoch {p.epoch + 1} is already over: the rest of "
                "its samples are skipped and training goes on with the next epoch (if max_epochs / max_iters leaves "
                "one)"
                if isinstance(batches, int) and p.iter_in_epoch >= batches
                else f"The epoch continues at batch {p.iter_in_epoch} of the new loader, so samples of this epoch are "
                "skipped or seen twice"
            )
            msg = (
                f"Resuming in the middle of epoch {p.epoch + 1} (after batch {p.iter_in_epoch}) with a "
                f"train_dataloader of another shape: {self.shape_change}. {follows}. "
                "Resume with the same batch_size, dataset, drop_last and number of processes, or from a checkpoint at "
                "an epoch end."
            )
            if self.logger is not None:
                self.logger.warning(msg)
            else:
                warnings.warn(msg, stacklevel=3)
        self.loader.load_state_dict({"epoch": p.epoch, "position": p.iter_in_epoch, "seed": state["seed"]})


class HookStates:
    """The stateful hooks of the list (as they are at each call), as ``{state_key: hook.state_dict()}``; a hook the
    checkpoint lacks starts fresh, with a warning."""

    def __init__(self, hooks: HookList) -> None:
        self.hooks = hooks

    def _stateful(self) -> dict[str, Stateful]:
        return {h.state_key: cast(Stateful, h) for h in self.hooks.stateful()}

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return {key: h.state_dict() for key, h in self._stateful().items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        for key, h in self._stateful().items():
            if key in state:
                h.load_state_dict(state[key])
            else:
                warnings.warn(f"The checkpoint holds no state for hook {key!r}; it starts fresh", stacklevel=2)


class MetaState:
    """``meta``: what people and tools read (version, time, seed, progress, world size, settings); loading it adopts the
    seed.

    Loaded first, after every piece was checked: a run that gave no seed takes the
    checkpoint's (its data order); another world size is a warning. :attr:`loaded` keeps the
    loaded entry (the trainer compares its settings).
    """

    def __init__(
        self, progress: Progress, world_size: int, config: dict[str, Any], seed: RunSeed, logger: logging.Logger
    ) -> None:
        self._progress, self._world_size, self._config, self._seed, self._logger = (
            progress,
            world_size,
            config,
            seed,
            logger,
        )
        self.loaded: Mapping[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        p, seed = self._progress, self._seed.value
        return {
            "trainwright_version": __version__,
            "torch_version": str(torch.__version__),  # a TorchVersion is a str subclass
            "format_version": FORMAT_VERSION,
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "seed": seed,
            "epoch": p.epoch,
            "iteration": p.iteration,
            "world_size": self._world_size,
            "config": self._config,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        self.loaded = state
        saved_seed = state.get("seed")
        if isinstance(saved_seed, int) and saved_seed != self._seed.value and not self._seed.given:
            self._seed.adopt(saved_seed)  # no seed given: continue the checkpoint's data order (mmengine semantics)
        saved_world = int(state.get("world_size", 1))
        if saved_world != self._world_size:
            self._logger.warning(
                f"Checkpoint was written by {saved_world} process(es), this run has {self._world_size}: the data order "
                "and random streams will differ from the original run"
            )
