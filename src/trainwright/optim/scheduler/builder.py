"""Build parameter schedulers from configs (``dict(type="CosineAnnealingLR", ...)``).

Objects first, configs second: every entry may be an already-built :class:`ParamScheduler`, which is passed through,
a torch ``LRScheduler`` built on the run's optimizer or a function ``optimizer -> LRScheduler`` (both become a
:class:`TorchScheduler`). Dict entries are resolved through ``PARAM_SCHEDULERS`` (a torch scheduler class as ``type``
is built on the run's optimizer); the key ``convert_to_iter_based=True`` turns an epoch-based entry into a
per-iteration (or, with ``by_update=True``, per-update) schedule via :meth:`ParamScheduler.build_iter_from_epoch`. An
entry without ``end`` ends with training, counted in its unit (epochs, iterations or optimizer updates), as in mmengine.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.optim.lr_scheduler import LRScheduler

from trainwright.optim.scheduler.base import INF, ParamScheduler
from trainwright.optim.scheduler.torch_scheduler import TorchScheduler
from trainwright.registry import PARAM_SCHEDULERS, accepted_kwargs, did_you_mean, dropping_scope

SchedulerCfg = Mapping[str, Any] | ParamScheduler | TorchScheduler | LRScheduler | Callable[[Any], LRScheduler]


#: How each scheduler unit reads in messages and in the run's log.
UNIT_WORDS = {"epoch": "epochs", "iter": "iterations", "update": "optimizer updates"}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _accumulation(optimizer: Any) -> int:
    """Micro-batches per optimizer update of ``optimizer`` (1 for a plain torch optimizer)."""
    acc = getattr(optimizer, "accumulative_counts", 1)
    return acc if isinstance(acc, int) and acc > 0 else 1


def run_length(
    unit: str, *, max_epochs: int | None, max_iters: int | None, epoch_length: int | None, accumulation: int = 1
) -> int | None:
    """The length of training counted in ``unit`` (``"epoch"``, ``"iter"`` or ``"update"``); None when not known.

    Updates close accumulation windows: ``ceil(max_iters / accumulation)`` in an iteration-based
    run, ``max_epochs * ceil(epoch_length / accumulation)`` in an epoch-based one (each epoch
    ends with its own, possibly shorter, window).
    """
    if unit == "epoch":
        return max_epochs
    per = 1 if unit == "iter" else accumulation
    if max_iters is not None:
        return _ceil_div(max_iters, per)
    if max_epochs is not None and epoch_length is not None:
        return max_epochs * _ceil_div(epoch_length, per)
    return None


def build_param_scheduler(
    cfg: SchedulerCfg,
    optimizer: Any,
    epoch_length: int | None = None,
    *,
    max_epochs: int | None = None,
    max_iters: int | None = None,
) -> ParamScheduler | TorchScheduler:
    """Build one scheduler from a config dict, a torch scheduler or a factory (or return a built one unchanged).

    Args:
        cfg: ``dict(type=name_or_class, **kwargs)``, optionally with
            ``convert_to_iter_based=True``; a :class:`ParamScheduler`; a torch
            ``LRScheduler`` built on the run's optimizer, or a function ``optimizer ->
            LRScheduler`` (stepped once per optimizer update: wrap it in
            ``dict(type="TorchScheduler", scheduler=..., by_epoch=True)`` for another unit).
            A torch scheduler class as ``type`` is built on the optimizer with the other keys
            (``by_epoch`` / ``by_update`` give its unit). mmengine's ``_scope_`` key is dropped,
            as by ``Registry.build``.
        optimizer: The optimizer (or wrapper) the scheduler drives.
        epoch_length: Iterations per epoch, needed by ``convert_to_iter_based`` and by the
            default ``end`` of a per-iteration or per-update config in an epoch-based run.
        max_epochs: The training length of an epoch-based run (default ``end``).
        max_iters: The training length of an iteration-based run (default ``end``).

    Raises:
        KeyError: Unknown ``type`` (with close matches) or a missing ``type`` key.
        TypeError: An argument the scheduler does not take (with close matches), or a
            ``cfg`` that is neither a dict, a scheduler nor a function returning one.
        ValueError: ``convert_to_iter_based=True`` without a usable ``epoch_length``; a config
            with both ``by_epoch=True`` and ``by_update=True``; a torch scheduler built on
            another optimizer object than the run's.
    """
    if isinstance(cfg, (ParamScheduler, TorchScheduler)):
        return cfg
    if isinstance(cfg, LRScheduler) or (callable(cfg) and not isinstance(cfg, Mapping)):
        return TorchScheduler(optimizer, cfg)
    if not isinstance(cfg, Mapping):
        raise TypeError(
            "A param scheduler must be a config dict with 'type', a ParamScheduler, a torch LRScheduler or a function "
            "optimizer -> LRScheduler, "
            f"got {type(cfg).__name__}: {cfg!r}."
        )
    if "type" not in cfg:
        raise KeyError(
            f"A param scheduler config needs a 'type' key, got keys {sorted(cfg)}; e.g. dict(type='CosineAnnealingLR', "
            "T_max=10)."
        )
    args = dict(cfg)
    typ = args.pop("type")
    with dropping_scope(args):  # mmengine's _scope_: dropped, as Registry.build does
        cls = PARAM_SCHEDULERS.get(typ) if isinstance(typ, str) else typ
        name = getattr(cls, "__name__", str(typ))
        if isinstance(cls, type) and issubclass(cls, LRScheduler):  # torch's class: built on the run's optimizer
            unit_args = {k: args.pop(k) for k in ("by_epoch", "by_update") if k in args}
            return TorchScheduler(optimizer, functools.partial(cls, **args), **unit_args)
        convert = bool(args.pop("convert_to_iter_based", False))
        if convert and not hasattr(cls, "build_iter_from_epoch"):
            raise TypeError(
                f"{name} cannot convert_to_iter_based (it has no epoch-valued window); give its unit with by_epoch / "
                "by_update instead."
            )
        accepted = accepted_kwargs(cls) or set()
        unknown = sorted(set(args) - accepted)
        if unknown:
            hints = "".join(did_you_mean(k, accepted) for k in unknown)
            raise TypeError(
                f"{name} got unknown argument(s) {unknown}.{hints} It accepts: "
                f"{', '.join(sorted(accepted - {'optimizer'}))}."
            )
        by_update = bool(args.get("by_update", False))
        if by_update and args.get("by_epoch") is True and not convert:
            raise ValueError(
                f"{name}: by_epoch=True and by_update=True name two units; give one (by_update=True counts optimizer "
                "updates, "
                "by_epoch=True epochs; add convert_to_iter_based=True to turn an epoch window into updates)."
            )
        acc = _accumulation(optimizer)
        if "end" not in args and "end" in accepted:
            unit = (
                "epoch"
                if convert or (args.get("by_epoch", True) and not by_update)
                else "update"
                if by_update
                else "iter"
            )
            default_end = run_length(
                unit, max_epochs=max_epochs, max_iters=max_iters, epoch_length=epoch_length, accumulation=acc
            )
            if (
                default_end is not None and args.get("begin", 0) < default_end
            ):  # (a window beginning after the run: warned about by warn_outside_run)
                args["end"] = default_end
        if convert:
            if epoch_length is None:
                raise ValueError(
                    f"{name}: convert_to_iter_based=True needs the number of iterations per epoch; "
                    "call build_param_schedulers(..., epoch_length=len(train_dataloader)) or drop "
                    "convert_to_iter_based."
                )
            steps_per_epoch = _ceil_div(epoch_length, acc) if by_update else epoch_length
            scheduler: ParamScheduler = cls.build_iter_from_epoch(optimizer, epoch_length=steps_per_epoch, **args)
        else:
            scheduler = cls(optimizer, **args)
        return scheduler


def _is_named_optimizers(optimizer: Any) -> bool:
    """A mapping of named optimizers / wrappers (an ``OptimWrapperDict``'s ``param_groups`` is keyed too, not a
    list)."""
    return callable(getattr(optimizer, "keys", None)) and not isinstance(getattr(optimizer, "param_groups", None), list)


def build_param_schedulers(
    cfgs: SchedulerCfg | Sequence[SchedulerCfg] | Mapping[str, Any],
    optimizer: Any,
    epoch_length: int | None = None,
    *,
    max_epochs: int | None = None,
    max_iters: int | None = None,
) -> list[Any] | dict[str, list[Any]]:
    """Build the list of schedulers for one optimizer, or one list per named optimizer.

    Args:
        cfgs: A config dict, a scheduler, a list of those, or — for several optimizers — a
            dict keyed by optimizer name whose values are any of the former.
        optimizer: An optimizer-like object (with ``param_groups``), or a mapping
            name → optimizer-like (e.g. an ``OptimWrapperDict``) for several optimizers.
        epoch_length: Iterations per epoch, for ``convert_to_iter_based=True`` entries and
            the default ``end`` of per-iteration / per-update entries in an epoch-based run.
        max_epochs: The length of an epoch-based run: the default ``end`` of entries that
            give none, in their unit (mmengine's runner does the same).
        max_iters: The length of an iteration-based run (same use).

    Returns:
        A list of schedulers in config order; a dict name → list when ``optimizer`` is a
        mapping of several optimizers (a plain list of configs is then built for each).

    Raises:
        KeyError: A per-optimizer key names no optimizer, or an unknown scheduler type.
    """
    kw: dict[str, Any] = dict(max_epochs=max_epochs, max_iters=max_iters)
    keyed_cfgs = cfgs if isinstance(cfgs, Mapping) and "type" not in cfgs else None
    if keyed_cfgs is not None or _is_named_optimizers(optimizer):
        if not _is_named_optimizers(optimizer):
            given = sorted(str(k) for k in keyed_cfgs or {})
            raise TypeError(
                f"param schedulers keyed by optimizer name ({given}) need a mapping name -> optimizer, "
                f"got {type(optimizer).__name__}; pass the optimizers by name or give a plain list of configs."
            )
        names = list(optimizer.keys())
        per_name: Mapping[str, Any] = keyed_cfgs if keyed_cfgs is not None else {n: cfgs for n in names}
        built: dict[str, list[Any]] = {}
        for key, sub in per_name.items():
            if key not in names:
                raise KeyError(
                    f"param scheduler config for optimizer {key!r}, but there is no such "
                    f"optimizer.{did_you_mean(key, names)} Optimizers: {names}."
                )
            built[key] = _build_list(sub, optimizer[key], epoch_length, kw)
        warn_outside_run(
            flatten_schedulers(built), max_epochs=max_epochs, max_iters=max_iters, epoch_length=epoch_length
        )
        return built
    schedulers = _build_list(cfgs, optimizer, epoch_length, kw)
    warn_outside_run(schedulers, max_epochs=max_epochs, max_iters=max_iters, epoch_length=epoch_length)
    return schedulers


def warn_outside_run(
    schedulers: Sequence[Any], *, max_epochs: int | None, max_iters: int | None, epoch_length: int | None
) -> list[Any]:
    """Warn about each scheduler whose window ``[begin, end)`` begins at or after the end of training: it would never
    apply.

    The run's length is counted in each scheduler's unit (:func:`run_length`): ``max_epochs``
    for an epoch-based one, ``max_iters`` (or ``max_epochs * epoch_length``) for an
    iteration-based one, the number of optimizer updates for a per-update one; a unit whose
    length is not known is not checked. Returns the schedulers warned about.
    """
    outside = []
    for s in schedulers:
        by_epoch = bool(getattr(s, "by_epoch", True))
        sunit = getattr(s, "unit", "epoch" if by_epoch else "iter")
        total = run_length(
            sunit,
            max_epochs=max_epochs,
            max_iters=max_iters,
            epoch_length=epoch_length,
            accumulation=_accumulation(getattr(s, "optimizer", None)),
        )
        if total is None:
            continue
        if sunit == "epoch":
            unit = f"max_epochs={max_epochs}"
        elif max_iters is not None:
            unit = f"max_iters={max_iters}" + (f" = {total} optimizer updates" if sunit == "update" else "")
        else:
            unit = (
                f"{max_epochs} epochs of {epoch_length} iterations = {total} "
                f"{'optimizer updates' if sunit == 'update' else 'iterations'}"
            )
        begin = getattr(s, "begin", 0)
        if total is None or not isinstance(begin, int) or begin < total:
            continue
        outside.append(s)
        end = getattr(s, "end", None)
        window = f"[{begin}, {'inf' if end is None or end >= INF else end})"
        warnings.warn(
            f"param_scheduler {type(s).__name__}(param_name={getattr(s, 'param_name', '?')!r}, begin={begin}, "
            f"by_epoch={by_epoch}) never applies: "
            f"its window {window} (in {UNIT_WORDS.get(sunit, sunit)}) begins at or after the end of training ({unit}). "
            "Fix its begin / end (in the unit of its by_epoch; convert_to_iter_based=True turns an epoch window into "
            "iterations), or train longer.",
            UserWarning,
            stacklevel=3,
        )
    return outside


def _build_list(cfgs: Any, optimizer: Any, epoch_length: int | None, kw: dict[str, Any]) -> list[Any]:
    one = isinstance(cfgs, (Mapping, ParamScheduler, TorchScheduler, LRScheduler)) or (
        callable(cfgs) and not isinstance(cfgs, (list, tuple))
    )
    items = [cfgs] if one else list(cfgs)
    return [build_param_scheduler(c, optimizer, epoch_length, **kw) for c in items]


def flatten_schedulers(schedulers: Any) -> list[Any]:
    """Every scheduler of what :func:`build_param_schedulers` returns (a list, a dict of lists per optimizer, one
    scheduler, or None)."""
    if not schedulers:
        return []
    if isinstance(schedulers, dict):
        return [s for v in schedulers.values() for s in flatten_schedulers(v)]
    if isinstance(schedulers, (list, tuple)):
        return list(schedulers)
    return [schedulers]


__all__ = [
    "UNIT_WORDS",
    "build_param_scheduler",
    "build_param_schedulers",
    "flatten_schedulers",
    "run_length",
    "warn_outside_run",
]
