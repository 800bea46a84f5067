"""Building the trainer's parts from objects or config dicts: the train loop with its loader, optim wrapper and
schedulers (and the checkpoint pieces they bring); the eval loops; the loop context of a run."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from trainwright.amp.precision import Precision
from trainwright.data.loader import build_dataloader, make_dataloader, make_resumable
from trainwright.data.stream_state import StreamState
from trainwright.loops.context import LoopContext
from trainwright.loops.eval_loop import EvalLoop
from trainwright.loops.train_loop import EpochBasedTrainLoop, IterBasedTrainLoop
from trainwright.optim.builder import build_optim_wrapper, loop_precision
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.optim.scheduler.base import INF
from trainwright.optim.scheduler.builder import flatten_schedulers
from trainwright.optim.spike_guard import SpikeGuard
from trainwright.trainer.state import DataOrderState, OptimState, SchedulerState

if TYPE_CHECKING:
    from trainwright.hooks.dispatch import HookList
    from trainwright.hooks.view import TrainerView
    from trainwright.logging.metric_store import MetricStore
    from trainwright.strategies.base import Strategy
    from trainwright.utils.progress import Progress

#: Keys ``train_cfg`` accepts.
TRAIN_CFG_KEYS = frozenset(
    {"by_epoch", "max_epochs", "max_iters", "val_interval", "val_begin", "gather_metric_period", "dynamic_intervals"}
)
#: Keys ``val_cfg`` / ``test_cfg`` accept.
EVAL_CFG_KEYS = frozenset({"autocast"})


@dataclass
class TrainSpec:
    """What the Trainer was given to build its train parts from (:func:`build_train`), as given."""

    #: ``train_cfg``, its keys checked.
    train_cfg: dict[str, Any]
    #: ``train_dataloader``: a ``DataLoader`` or a dict of its arguments (``find_batch_size(apply=True)`` replaces it).
    loader_cfg: Any
    #: ``optim_wrapper``.
    optim_cfg: Any
    #: ``param_scheduler``.
    scheduler_cfg: Any
    #: ``nonfinite_loss="skip"``: the optim wrappers skip a non-finite update.
    skip_nonfinite: bool
    #: ``spike_guard``, built.
    spike_guard: SpikeGuard | None


class TrainParts(NamedTuple):
    """What ``train()`` needs beyond the model: built together because each depends on the previous."""

    optim_wrapper: Any
    precision: Precision
    train_loop: EpochBasedTrainLoop | IterBasedTrainLoop
    param_schedulers: Any


def train_by_epoch(train_cfg: Mapping[str, Any]) -> bool:
    """Whether ``train_cfg`` makes an epoch-based train loop: its ``by_epoch``, else True unless it gives
    ``max_iters``."""
    return bool(train_cfg.get("by_epoch", "max_iters" not in train_cfg))


def build_train(strategy: Strategy, hooks: HookList, spec: TrainSpec, *, model: nn.Module, seed: int) -> TrainParts:
    """The resumable train loader, the optim wrapper over ``model``, the train loop and the param schedulers, from
    ``spec`` under the strategy's precision.

    The precision returned is the one object the optim wrapper and the loops share (the
    wrapper's own, when it is mixed).

    Raises:
        ValueError / KeyError: a missing train_dataloader, optim_wrapper, ``max_epochs`` /
            ``max_iters``, or an empty loader (each message says what to pass).
    """
    loader_cfg, optim_cfg, scheduler_cfg = spec.loader_cfg, spec.optim_cfg, spec.scheduler_cfg
    precision = strategy.precision
    if loader_cfg is None:
        raise ValueError(
            "train() needs a train_dataloader: pass train_dataloader=DataLoader(...) or dict(dataset=..., "
            "batch_size=...)"
        )
    if optim_cfg is None:
        raise ValueError("train() needs an optim_wrapper, e.g. optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01))")
    cfg = dict(spec.train_cfg)
    if "max_epochs" in cfg and "max_iters" in cfg:
        raise ValueError(
            f"train_cfg sets both max_epochs={cfg['max_epochs']} and max_iters={cfg['max_iters']}: give one, "
            "dict(by_epoch=True, max_epochs=N) or dict(by_epoch=False, max_iters=N)"
        )
    by_epoch = train_by_epoch(cfg)
    cfg.pop("by_epoch", None)
    loader = build_dataloader(
        loader_cfg, seed=seed, num_replicas=strategy.data_parallel_size, rank=strategy.data_parallel_rank
    )  # this rank's shard
    length = loader.length  # None: a stream without __len__ (endless, or of unknown length)
    if length is None and by_epoch:
        ds = loader.dataset
        raise TypeError(
            f"train_dataloader's IterableDataset {type(ds).__name__} has no __len__: training by epochs needs the "
            "number of batches per epoch (epoch ends, validation and checkpoint points, schedulers, the ETA). Train "
            "by iterations, train_cfg=dict(by_epoch=False, max_iters=N) (an endless stream), or give the dataset a "
            "`def __len__(self): return <samples it yields per process>`, or use a map-style Dataset (__getitem__ "
            "and __len__)."
        )
    if length == 0:
        raise ValueError(
            "train_dataloader is empty (0 batches): check the dataset length, and that batch_size <= len(dataset) when "
            "drop_last=True"
        )
    optim_wrapper = build_optim_wrapper(model, optim_cfg, precision, strategy.device.type)
    precision = loop_precision(optim_wrapper, precision)
    if spec.skip_nonfinite:
        for ow in optim_wrappers_of(optim_wrapper).values():
            ow.skip_nonfinite = True
    if spec.spike_guard is not None:
        _attach_spike_guard(hooks, optim_wrapper, spec.spike_guard)
    loop: EpochBasedTrainLoop | IterBasedTrainLoop
    if by_epoch:
        if "max_epochs" not in cfg:
            raise KeyError(
                "train_cfg with by_epoch=True needs max_epochs, e.g. train_cfg=dict(by_epoch=True, max_epochs=10)"
            )
        loop = EpochBasedTrainLoop(loader, **cfg)
    else:
        if "max_iters" not in cfg:
            raise KeyError(
                "train_cfg with by_epoch=False needs max_iters, e.g. train_cfg=dict(by_epoch=False, max_iters=2000)"
            )
        loop = IterBasedTrainLoop(loader, **cfg)
    schedulers = None
    if scheduler_cfg:
        from trainwright.optim.scheduler import build_param_schedulers

        schedulers = build_param_schedulers(
            scheduler_cfg,
            optim_wrapper,
            epoch_length=length,
            max_epochs=getattr(loop, "max_epochs", None),
            max_iters=None if loop.by_epoch else loop.max_iters,
        )
        if not loop.by_epoch:
            _warn_epoch_schedulers(schedulers)
    return TrainParts(optim_wrapper, precision, loop, schedulers)


#: The checkpoint pieces of the train parts (:func:`train_pieces`).
TRAIN_PIECES = ("optim_wrapper", "param_schedulers", "data_state", "train_dataloader")


def train_pieces(strategy: Strategy, parts: TrainParts, data_order: DataOrderState) -> dict[str, Any]:
    """The checkpoint pieces the train parts bring (the manager holds None for them until they are built): the optim
    wrapper(s), the schedulers, the loader's data order and a stream's own position (a stateful loader's)."""
    return {
        "optim_wrapper": OptimState(strategy, parts.optim_wrapper) if parts.optim_wrapper is not None else None,
        "param_schedulers": SchedulerState(parts.param_schedulers) if parts.param_schedulers else None,
        "data_state": StreamState(
            parts.train_loop.dataloader, strategy.gather_object, strategy.rank, strategy.world_size
        ),
        "train_dataloader": data_order,
    }


def loop_context(
    view: TrainerView,
    model: Any,
    hooks: HookList,
    progress: Progress,
    optim_wrapper: Any,
    metric_store: MetricStore,
    precision: Precision,
    logger: logging.Logger,
    eval_loops: tuple[EvalLoop | None, EvalLoop | None],
) -> LoopContext:
    """What the loops use in one run (the model as prepared); ``validate`` runs the val loop (the first of
    ``eval_loops``, val and test), and the eval loops hold the context from the start, so a hook can call ``run_pass``
    at any event."""
    ctx = LoopContext(
        view=view,
        model=model,
        hooks=hooks,
        progress=progress,
        optim_wrapper=optim_wrapper,
        metric_store=metric_store,
        precision=precision,
        logger=logger,
    )
    val_loop = eval_loops[0]
    if val_loop is not None:
        ctx.validate = partial(val_loop.run, ctx)
    for loop in eval_loops:
        if loop is not None:
            loop.ctx = ctx
    return ctx


def _attach_spike_guard(hooks: HookList, optim_wrapper: Any, guard: SpikeGuard) -> None:
    """Give the run's one optim wrapper the guard; a rollback needs something to roll back to (checked before
    training starts)."""
    wrappers = optim_wrappers_of(optim_wrapper)
    if len(wrappers) != 1:
        raise ValueError(
            f"spike_guard judges the loss of one optim wrapper; this run has {len(wrappers)} ({sorted(wrappers)}). "
            "Drop spike_guard, or use one optim wrapper."
        )
    if guard.action == "rollback" and guard.capture_every is None:
        policy = [
            saves for h in hooks if (saves := h.saves_periodic_checkpoints()) is not None
        ]  # the periodic saves a rollback goes back to
        if not any(policy):
            raise ValueError(
                "spike_guard action='rollback' has no checkpoint to roll back to: "
                + (
                    "there is no CheckpointHook (default_hooks checkpoint=None)"
                    if not policy
                    else "the CheckpointHook saves no periodic checkpoints (interval <= 0)"
                )
                + ". Keep one (e.g. default_hooks=dict(checkpoint=dict(interval=500, by_epoch=False))), or keep one "
                "in memory with "
                "spike_guard=dict(action='rollback', capture_every=500), or use action='skip'."
            )
    next(iter(wrappers.values())).spike_guard = guard


def _warn_epoch_schedulers(schedulers: Any) -> None:
    """An epoch-based scheduler in an iteration-based run would never step (one 'epoch' spans the run)."""
    flat = flatten_schedulers(schedulers)
    # A metric-driven scheduler steps at validations; with its default window its epoch count does not matter.
    stuck = [
        type(s).__name__
        for s in flat
        if getattr(s, "by_epoch", False) and not (s.need_val_args and s.begin == 0 and s.end == INF)
    ]
    if stuck:
        warnings.warn(
            f"param_scheduler {stuck} count(s) in epochs (by_epoch=True) but training is iteration-based (train_cfg "
            "by_epoch=False): "
            "they would never step and the value would stay constant. Add convert_to_iter_based=True to convert their "
            "begin/end "
            "to iterations, or give them by_epoch=False with begin/end in iterations.",
            stacklevel=3,
        )


class DataParallelGroup:
    """Evaluation's collectives when several processes share a data shard (tensor parallelism): one member per shard.

    Every process takes part in each gather; the result holds the first object of each data
    shard, in shard order (the layout :func:`~trainwright.evaluation.collect.merge_rank_results`
    expects of ``world_size`` ranks).
    """

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    @property
    def world_size(self) -> int:  # noqa: D102 - see Collectives
        return int(self.strategy.data_parallel_size)

    @property
    def is_main_process(self) -> bool:  # noqa: D102 - see Collectives
        return bool(self.strategy.is_main_process)

    def gather_object(self, obj: Any) -> list[Any]:
        """``obj`` of one process per data shard (the first of each), in shard order."""
        out: dict[int, Any] = {}
        for shard, value in self.strategy.gather_object((self.strategy.data_parallel_rank, obj)):
            out.setdefault(shard, value)
        return [out[s] for s in range(self.world_size)]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:  # noqa: D102 - see Collectives
        return self.strategy.broadcast_object(obj, src=src)


def build_eval_loop(
    strategy: Strategy, loader: Any, evaluator: Any, mode: str, cfg: Mapping[str, Any]
) -> EvalLoop | None:
    """A val / test loop from a DataLoader (or its dict) and a metric / list of metrics / Evaluator; None without a
    loader.

    Under several processes a ``DataLoader`` is rebuilt around this rank's shard (padded to
    equal lengths, ``DistributedSampler`` semantics; a sampler that shards itself is kept):
    every rank evaluates its part and the metrics gather the results without the padding,
    so the numbers equal one process's. Any other iterable of batches is used as given.
    The shards are the strategy's data-parallel ones: the processes of one tensor-parallel
    group evaluate the same batches, and the metrics take one result list per shard.
    """
    if loader is None:
        return None
    if isinstance(loader, Mapping):
        loader = make_dataloader(loader, f"{mode}_dataloader")
    if strategy.data_parallel_size > 1:
        if isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
            loader = make_resumable(
                loader, 0, strategy.data_parallel_size, strategy.data_parallel_rank, f"{mode}_dataloader"
            )
        else:
            warnings.warn(
                f"The {mode}_dataloader ({type(loader).__name__}) cannot be sharded by trainwright, so under "
                f"{strategy.world_size} "
                "processes every rank evaluates what it yields, and the metrics take each rank's results as its shard: "
                "give each "
                "rank its own part of the data (e.g. by trainer.strategy.rank), or pass a DataLoader over a map-style "
                "dataset.",
                stacklevel=3,
            )
    if evaluator is not None:
        from trainwright.evaluation import Evaluator

        evaluator = evaluator if isinstance(evaluator, Evaluator) else Evaluator(evaluator)
        # results are gathered over the strategy's process group, one list per data shard
        evaluator.use_collectives(
            strategy if strategy.data_parallel_size == strategy.world_size else DataParallelGroup(strategy)
        )
    return EvalLoop(loader, evaluator, mode, autocast=bool(cfg.get("autocast", False)))
