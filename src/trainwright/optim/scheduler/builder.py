"""Build parameter schedulers from configs (``dict(type="CosineAnnealingLR", ...)``).

Objects first, configs second: every entry may be an already-built :class:`ParamScheduler`,
which is passed through. Dict entries are resolved through ``PARAM_SCHEDULERS``; the key
``convert_to_iter_based=True`` turns an epoch-based entry into a per-iteration schedule via
:meth:`ParamScheduler.build_iter_from_epoch`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from trainwright.optim.scheduler.base import INF, ParamScheduler
from trainwright.registry import PARAM_SCHEDULERS, accepted_kwargs, did_you_mean, dropping_scope

SchedulerCfg = Mapping[str, Any] | ParamScheduler


def build_param_scheduler(
    cfg: SchedulerCfg,
    optimizer: Any,
    epoch_length: int | None = None,
    *,
    max_epochs: int | None = None,
    max_iters: int | None = None,
) -> ParamScheduler:
    """Build one scheduler from a config dict (or return a built one unchanged).

    Args:
        cfg: ``dict(type=name_or_class, **kwargs)``, optionally with
            ``convert_to_iter_based=True``; or a :class:`ParamScheduler`. mmengine's
            ``_scope_`` key is dropped, as by ``Registry.build``.
        optimizer: The optimizer (or wrapper) the scheduler drives.
        epoch_length: Iterations per epoch, needed by ``convert_to_iter_based``.
        max_epochs: Default ``end`` of an epoch-based config that gives none.
        max_iters: Default ``end`` of an iteration-based config that gives none.

    Raises:
        KeyError: Unknown ``type`` (with close matches) or a missing ``type`` key.
        TypeError: An argument the scheduler does not take (with close matches), or a
            ``cfg`` that is neither a dict nor a scheduler.
        ValueError: ``convert_to_iter_based=True`` without a usable ``epoch_length``.
    """
    if isinstance(cfg, ParamScheduler):
        return cfg
    if not isinstance(cfg, Mapping):
        raise TypeError(f"A param scheduler must be a config dict with 'type' or a ParamScheduler, got {type(cfg).__name__}: {cfg!r}.")
    if "type" not in cfg:
        raise KeyError(f"A param scheduler config needs a 'type' key, got keys {sorted(cfg)}; e.g. dict(type='CosineAnnealingLR', T_max=10).")
    args = dict(cfg)
    typ = args.pop("type")
    with dropping_scope(args):  # mmengine's _scope_: dropped, as Registry.build does
        cls = PARAM_SCHEDULERS.get(typ) if isinstance(typ, str) else typ
        name = getattr(cls, "__name__", str(typ))
        convert = bool(args.pop("convert_to_iter_based", False))
        accepted = accepted_kwargs(cls) or set()
        unknown = sorted(set(args) - accepted)
        if unknown:
            hints = "".join(did_you_mean(k, accepted) for k in unknown)
            raise TypeError(f"{name} got unknown argument(s) {unknown}.{hints} It accepts: {', '.join(sorted(accepted - {'optimizer'}))}.")
        if "end" not in args:
            default_end = max_epochs if args.get("by_epoch", True) else max_iters
            if default_end is not None and args.get("begin", 0) < default_end:  # (a window beginning after the run: warned about by warn_outside_run)
                args["end"] = default_end
        if convert:
            if epoch_length is None:
                raise ValueError(
                    f"{name}: convert_to_iter_based=True needs the number of iterations per epoch; "
                    "call build_param_schedulers(..., epoch_length=len(train_dataloader)) or drop convert_to_iter_based."
                )
            scheduler: ParamScheduler = cls.build_iter_from_epoch(optimizer, epoch_length=epoch_length, **args)
        else:
            scheduler = cls(optimizer, **args)
        return scheduler


def _is_named_optimizers(optimizer: Any) -> bool:
    """A mapping of named optimizers / wrappers (an ``OptimWrapperDict``'s ``param_groups`` is keyed too, not a list)."""
    return callable(getattr(optimizer, "keys", None)) and not isinstance(getattr(optimizer, "param_groups", None), list)


def build_param_schedulers(
    cfgs: SchedulerCfg | Sequence[SchedulerCfg] | Mapping[str, Any],
    optimizer: Any,
    epoch_length: int | None = None,
    *,
    max_epochs: int | None = None,
    max_iters: int | None = None,
) -> list[ParamScheduler] | dict[str, list[ParamScheduler]]:
    """Build the list of schedulers for one optimizer, or one list per named optimizer.

    Args:
        cfgs: A config dict, a scheduler, a list of those, or — for several optimizers — a
            dict keyed by optimizer name whose values are any of the former.
        optimizer: An optimizer-like object (with ``param_groups``), or a mapping
            name → optimizer-like (e.g. an ``OptimWrapperDict``) for several optimizers.
        epoch_length: Iterations per epoch, for ``convert_to_iter_based=True`` entries.
        max_epochs: Default ``end`` for epoch-based entries that give none (mmengine's
            runner does the same with the training length).
        max_iters: Default ``end`` for iteration-based entries that give none.

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
        built: dict[str, list[ParamScheduler]] = {}
        for key, sub in per_name.items():
            if key not in names:
                raise KeyError(f"param scheduler config for optimizer {key!r}, but there is no such optimizer.{did_you_mean(key, names)} Optimizers: {names}.")
            built[key] = _build_list(sub, optimizer[key], epoch_length, kw)
        warn_outside_run(flatten_schedulers(built), max_epochs=max_epochs, max_iters=max_iters, epoch_length=epoch_length)
        return built
    schedulers = _build_list(cfgs, optimizer, epoch_length, kw)
    warn_outside_run(schedulers, max_epochs=max_epochs, max_iters=max_iters, epoch_length=epoch_length)
    return schedulers


def warn_outside_run(schedulers: Sequence[Any], *, max_epochs: int | None, max_iters: int | None, epoch_length: int | None) -> list[Any]:
    """Warn about each scheduler whose window ``[begin, end)`` begins at or after the end of training: it would never apply.

    The run's length is counted in each scheduler's unit: ``max_epochs`` for an epoch-based
    one, ``max_iters`` (or ``max_epochs * epoch_length``) for an iteration-based one; a unit
    whose length is not known is not checked. Returns the schedulers warned about.
    """
    outside = []
    for s in schedulers:
        by_epoch = bool(getattr(s, "by_epoch", True))
        if by_epoch:
            total, unit = max_epochs, f"max_epochs={max_epochs}"
        elif max_iters is not None:
            total, unit = max_iters, f"max_iters={max_iters}"
        elif max_epochs is not None and epoch_length is not None:
            total, unit = max_epochs * epoch_length, f"{max_epochs} epochs of {epoch_length} iterations = {max_epochs * epoch_length} iterations"
        else:
            continue
        begin = getattr(s, "begin", 0)
        if total is None or not isinstance(begin, int) or begin < total:
            continue
        outside.append(s)
        end = getattr(s, "end", None)
        window = f"[{begin}, {'inf' if end is None or end >= INF else end})"
        warnings.warn(
            f"param_scheduler {type(s).__name__}(param_name={getattr(s, 'param_name', '?')!r}, begin={begin}, by_epoch={by_epoch}) never applies: "
            f"its window {window} (in {'epochs' if by_epoch else 'iterations'}) begins at or after the end of training ({unit}). "
            "Fix its begin / end (in the unit of its by_epoch; convert_to_iter_based=True turns an epoch window into iterations), or train longer.",
            UserWarning,
            stacklevel=3,
        )
    return outside


def _build_list(cfgs: Any, optimizer: Any, epoch_length: int | None, kw: dict[str, Any]) -> list[ParamScheduler]:
    items = [cfgs] if isinstance(cfgs, (Mapping, ParamScheduler)) else list(cfgs)
    return [build_param_scheduler(c, optimizer, epoch_length, **kw) for c in items]


def flatten_schedulers(schedulers: Any) -> list[Any]:
    """Every scheduler of what :func:`build_param_schedulers` returns (a list, a dict of lists per optimizer, one scheduler, or None)."""
    if not schedulers:
        return []
    if isinstance(schedulers, dict):
        return [s for v in schedulers.values() for s in flatten_schedulers(v)]
    if isinstance(schedulers, (list, tuple)):
        return list(schedulers)
    return [schedulers]


__all__ = ["build_param_scheduler", "build_param_schedulers", "flatten_schedulers", "warn_outside_run"]
