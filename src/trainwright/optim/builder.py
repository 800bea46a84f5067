"""Build optim wrappers from objects or dicts (dicts through a constructor, see ``optim/constructor.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainwright.amp.precision import MixedPrecision, Precision, build_precision
from trainwright.optim.constructor import DefaultOptimWrapperConstructor, build_optimizer
from trainwright.optim.optim_wrapper import AmpOptimWrapper, OptimWrapper
from trainwright.optim.optim_wrapper_dict import OptimWrapperDict, optim_wrappers_of
from trainwright.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS, check_keys, dropping_scope

_WRAPPER_KEYS = {
    "type",
    "optimizer",
    "accumulative_counts",
    "clip_grad",
    "dtype",
    "loss_scale",
    "skip_nonfinite",
    "device_type",
    "paramwise_cfg",
    "constructor",
    "compile",
    "use_fsdp",
}


__all__ = ["build_optim_wrapper", "build_optimizer", "loop_precision", "run_precision"]


def _check_owns(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Refuse an optimizer built over parameters that are not ``model``'s: stepping it would train nothing of the
    model."""
    own = {id(p) for p in model.parameters()}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    foreign = sum(id(p) not in own for p in params)
    if foreign:
        raise ValueError(
            f"The {type(optimizer).__name__} given as optim_wrapper holds {foreign} of its {len(params)} parameters "
            "that are not the model's "
            f"({type(model).__name__}), so training would not change them. Build it over this model's parameters, "
            "e.g. torch.optim.SGD(model.parameters(), lr=0.1) with the same model object passed to the Trainer, or "
            "pass "
            "optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)) and let the Trainer build it (a sharding strategy "
            "such as "
            "strategy='fsdp' replaces the parameters with their shards, so it needs the Trainer to build the "
            "optimizer)."
        )


def _reconcile(wrapper: OptimWrapper, trainer_precision: Precision) -> None:
    """Make ``wrapper`` use the Trainer's precision, or fail if the two disagree.

    A wrapper with plain precision adopts the Trainer's; a wrapper with its own precision
    (``AmpOptimWrapper``) is kept when the Trainer says ``"32"`` (the default) or a precision
    that agrees with it (:meth:`~trainwright.amp.precision.Precision.agrees_with`: the same
    autocast dtype), and is an error otherwise.
    """
    own = wrapper.precision
    if trainer_precision.plain or own is trainer_precision:
        return
    if own.plain:
        wrapper.precision = trainer_precision
        return
    if not (own.agrees_with(trainer_precision) and trainer_precision.agrees_with(own)):
        raise ValueError(
            f"Conflicting mixed precision: Trainer(precision={trainer_precision.name!r}) but the optim wrapper "
            f"{type(wrapper).__name__} uses {own.name!r} (dtype={own.dtype}). Set the dtype in one place only: "
            "either drop precision= from the Trainer, or use a plain OptimWrapper (type='OptimWrapper') and let "
            "precision= decide."
        )


def loop_precision(optim_wrapper: OptimWrapper | OptimWrapperDict, default: Precision) -> Precision:
    """The precision the loops use (val/test autocast): the optim wrapper's, if it is not plain."""
    for ow in optim_wrappers_of(optim_wrapper).values():
        if not ow.precision.plain:
            return ow.precision
    return default


def run_precision(cfg: Any, precision: str | Precision | None, device_type: str = "cpu") -> Precision:
    """The run's precision, known before the optim wrapper is built: ``precision``, or the one an ``AmpOptimWrapper``
    names.

    An ``AmpOptimWrapper`` object brings its own (that object); a config dict with
    ``type="AmpOptimWrapper"`` names a dtype (float16 by default). A conflict with a mixed
    ``precision`` is reported when the wrapper is built (:func:`build_optim_wrapper`).
    """
    trainer_precision = build_precision(precision, device_type)
    if not trainer_precision.plain:
        return trainer_precision
    if isinstance(cfg, (OptimWrapper, OptimWrapperDict)):
        return loop_precision(cfg, trainer_precision)
    if isinstance(cfg, Mapping):
        typ = cfg.get("type", "OptimWrapper")
        try:
            cls = OPTIM_WRAPPERS.get(typ) if isinstance(typ, str) else typ
        except KeyError:
            return trainer_precision  # reported when the wrapper is built
        if isinstance(cls, type) and issubclass(cls, AmpOptimWrapper):
            dtype = cfg.get("dtype") or "float16"
            return (
                MixedPrecision(dtype, cfg.get("device_type") or device_type)
                if dtype not in ("float32", "float64", torch.float32, torch.float64)
                else trainer_precision
            )
    return trainer_precision


def build_optim_wrapper(
    model: nn.Module, cfg: Any, precision: str | Precision | None = None, device_type: str = "cpu"
) -> OptimWrapper | OptimWrapperDict:
    """Build an :class:`OptimWrapper` (or :class:`OptimWrapperDict`) for ``model``.

    Args:
        model: The (unwrapped) model whose trainable parameters are optimized.
        cfg: An OptimWrapper / OptimWrapperDict / torch optimizer, or a dict
            ``dict(type="OptimWrapper", optimizer=dict(type="SGD", lr=0.1), accumulative_counts=1,
            clip_grad=None)`` (``type="AmpOptimWrapper"`` adds ``dtype`` and ``loss_scale``); or,
            for several optimizers, ``dict(generator=dict(optimizer=...),
            discriminator=dict(optimizer=...))`` whose keys name submodules of ``model``.
            mmengine's ``_scope_`` key is dropped, as by ``Registry.build``.
        precision: Trainer precision (a name or a :class:`Precision`). A plain ``OptimWrapper``
            uses it (the same object, so the loops and the wrapper share one precision); an
            ``AmpOptimWrapper`` whose dtype differs from it is an error. With several
            optimizers each wrapper gets its own copy (its own GradScaler).
        device_type: Device type of the parameters (for autocast / GradScaler).

    Raises:
        ValueError: ``precision`` and an ``AmpOptimWrapper`` ``dtype`` disagree.
    """
    trainer_precision = build_precision(precision, device_type)
    if isinstance(cfg, OptimWrapper):
        _check_owns(model, cfg.optimizer)
        _reconcile(cfg, trainer_precision)
        return cfg
    if isinstance(cfg, OptimWrapperDict):
        for i, ow in enumerate(cfg.values()):
            _check_owns(model, ow.optimizer)
            _reconcile(ow, trainer_precision if i == 0 else trainer_precision.clone())
        return cfg
    if isinstance(cfg, torch.optim.Optimizer):
        _check_owns(model, cfg)
        return OptimWrapper(cfg, precision=trainer_precision)
    if not isinstance(cfg, Mapping):
        raise TypeError(
            "optim_wrapper must be an OptimWrapper, a torch optimizer or a dict with an 'optimizer' key, got "
            f"{type(cfg).__name__}"
        )
    args = dict(cfg)
    with dropping_scope(
        args
    ):  # mmengine's _scope_: dropped, as Registry.build does (also for the constructor and the optimizer it builds)
        return _from_dict(model, args, trainer_precision, device_type)


def _from_dict(
    model: nn.Module, cfg: dict[str, Any], trainer_precision: Precision, device_type: str
) -> OptimWrapper | OptimWrapperDict:
    """``build_optim_wrapper`` of a config dict (its ``_scope_`` already dropped)."""
    if "constructor" in cfg and cfg["constructor"] not in (
        "DefaultOptimWrapperConstructor",
        DefaultOptimWrapperConstructor,
    ):
        return _construct(model, cfg, trainer_precision, device_type)  # a custom constructor reads its own config
    if "optimizer" not in cfg:
        if cfg and all(isinstance(v, Mapping) and "optimizer" in v for v in cfg.values()):
            wrappers: dict[str, Any] = {}
            for i, (name, sub) in enumerate(cfg.items()):
                sub_model = getattr(model, name, None)
                if not isinstance(sub_model, nn.Module):
                    raise KeyError(
                        f"optim_wrapper has an entry {name!r} but the model has no submodule of that name; keys must "
                        "name submodules"
                    )
                wrappers[name] = build_optim_wrapper(
                    sub_model, sub, trainer_precision if i == 0 else trainer_precision.clone(), device_type
                )
            return OptimWrapperDict(**wrappers)
        raise KeyError(
            "optim_wrapper dict needs an 'optimizer' key, e.g. dict(optimizer=dict(type='SGD', lr=0.1)); got keys "
            f"{sorted(cfg)}"
        )
    check_keys("optim_wrapper", cfg, _WRAPPER_KEYS)
    typ = cfg.get("type", "OptimWrapper")
    cls = OPTIM_WRAPPERS.get(typ) if isinstance(typ, str) else typ
    amp_only = sorted(k for k in ("dtype", "loss_scale", "device_type", "use_fsdp") if k in cfg)
    if amp_only and not (isinstance(cls, type) and issubclass(cls, AmpOptimWrapper)):
        raise KeyError(
            f"optim_wrapper keys {amp_only} need type='AmpOptimWrapper' (got type={typ!r}); or drop them and pass "
            "Trainer(precision='16-mixed' / 'bf16-mixed')"
        )
    return _construct(model, cfg, trainer_precision, device_type)


def _construct(model: nn.Module, cfg: Mapping[str, Any], trainer_precision: Precision, device_type: str) -> Any:
    """Build through the config's ``constructor`` (default: :class:`DefaultOptimWrapperConstructor`), then adopt the
    Trainer's precision."""
    args = dict(cfg)
    constructor = args.pop("constructor", "DefaultOptimWrapperConstructor")
    paramwise_cfg = args.pop("paramwise_cfg", None)
    typ = args.get("type", "OptimWrapper")
    cls = OPTIM_WRAPPERS.get(typ) if isinstance(typ, str) else typ
    if isinstance(cls, type) and issubclass(cls, AmpOptimWrapper):
        args.setdefault(
            "device_type", device_type
        )  # the model is still on the CPU here; autocast / GradScaler need the run's device
    builder = OPTIM_WRAPPER_CONSTRUCTORS.build(
        dict(type=constructor, optim_wrapper_cfg=args, paramwise_cfg=paramwise_cfg)
    )
    wrapper = builder(model)
    wrappers = (
        optim_wrappers_of(wrapper) if isinstance(wrapper, (OptimWrapper, OptimWrapperDict)) else {}
    )  # a custom constructor's own object: as it is
    for i, ow in enumerate(wrappers.values()):
        _check_owns(model, ow.optimizer)
        _reconcile(ow, trainer_precision if i == 0 else trainer_precision.clone())
    return wrapper
