"""Build optim wrappers from objects or dicts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainwright.amp.precision import Precision, build_precision
from trainwright.optim.optim_wrapper import OptimWrapper
from trainwright.optim.optim_wrapper_dict import OptimWrapperDict
from trainwright.registry import OPTIM_WRAPPERS, OPTIMIZERS

_WRAPPER_KEYS = {"type", "optimizer", "accumulative_counts", "clip_grad", "dtype", "loss_scale", "skip_nonfinite", "device_type"}


def build_optimizer(model: nn.Module, cfg: Mapping[str, Any] | torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Build ``cfg`` (``dict(type="AdamW", lr=...)``; any ``torch.optim`` name) over the trainable parameters."""
    if isinstance(cfg, torch.optim.Optimizer):
        return cfg
    if not isinstance(cfg, Mapping):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or a dict like dict(type='SGD', lr=0.1), got {type(cfg).__name__}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(model).__name__} has no parameters that require gradients; nothing to optimize")
    return OPTIMIZERS.build(cfg, params=params)


def build_optim_wrapper(model: nn.Module, cfg: Any, precision: str | Precision | None = None, device_type: str = "cpu") -> OptimWrapper | OptimWrapperDict:
    """Build an :class:`OptimWrapper` (or :class:`OptimWrapperDict`) for ``model``.

    Args:
        model: The (unwrapped) model whose trainable parameters are optimized.
        cfg: An OptimWrapper / OptimWrapperDict / torch optimizer, or a dict
            ``dict(type="OptimWrapper", optimizer=dict(type="SGD", lr=0.1), accumulative_counts=1,
            clip_grad=None)``; or, for several optimizers, ``dict(generator=dict(optimizer=...),
            discriminator=dict(optimizer=...))`` whose keys name submodules of ``model``.
        precision: Trainer precision name; mixed precision turns a plain ``OptimWrapper``
            config into an autocast one.
        device_type: Device type of the parameters (for autocast / GradScaler).
    """
    if isinstance(cfg, (OptimWrapper, OptimWrapperDict)):
        return cfg
    if isinstance(cfg, torch.optim.Optimizer):
        return OptimWrapper(cfg, precision=build_precision(precision, device_type))
    if not isinstance(cfg, Mapping):
        raise TypeError(f"optim_wrapper must be an OptimWrapper, a torch optimizer or a dict with an 'optimizer' key, got {type(cfg).__name__}")
    if "optimizer" not in cfg:
        if cfg and all(isinstance(v, Mapping) and "optimizer" in v for v in cfg.values()):
            wrappers = {}
            for name, sub in cfg.items():
                sub_model = getattr(model, name, None)
                if not isinstance(sub_model, nn.Module):
                    raise KeyError(f"optim_wrapper has an entry {name!r} but the model has no submodule of that name; keys must name submodules")
                wrappers[name] = build_optim_wrapper(sub_model, sub, precision, device_type)
            return OptimWrapperDict(**wrappers)
        raise KeyError(f"optim_wrapper dict needs an 'optimizer' key, e.g. dict(optimizer=dict(type='SGD', lr=0.1)); got keys {sorted(cfg)}")
    from trainwright.registry import did_you_mean

    for key in cfg:
        if key not in _WRAPPER_KEYS:
            raise KeyError(f"Unknown optim_wrapper key {key!r}.{did_you_mean(key, sorted(_WRAPPER_KEYS))} Allowed: {sorted(_WRAPPER_KEYS)}")
    args = dict(cfg)
    typ = args.pop("type", "OptimWrapper")
    cls = OPTIM_WRAPPERS.get(typ) if isinstance(typ, str) else typ
    args["optimizer"] = build_optimizer(model, args["optimizer"])
    if cls is OptimWrapper:
        args["precision"] = build_precision(precision, device_type)
    elif precision not in (None, "32", "fp32", "32-true"):
        raise ValueError(f"precision={precision!r} was given together with optim_wrapper type {typ!r}; set the dtype in one place only")
    return cls(**args)
