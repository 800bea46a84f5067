"""Activation checkpointing: recompute chosen blocks' activations in the backward pass instead of keeping them.

Each matched module's ``forward`` is replaced, on the instance, by one that runs the class's
forward under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` (mmengine's
``turn_on_activation_checkpointing`` does the same). No wrapper module is inserted, so
state-dict keys, ``isinstance`` and class names stay as they were, checkpoints of runs with
and without it are interchangeable, and FSDP2's ``fully_shard`` / ``module.compile()`` apply
to the block as before (their hooks run around the checkpointed forward).
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

Target = type[nn.Module] | str


def _user_module(model: nn.Module) -> nn.Module:
    """The user's module under the plain-module adapter (module paths are the user's)."""
    from trainwright.model.base_model import ModuleAdapter

    return model.module if isinstance(model, ModuleAdapter) else model


def select_modules(model: nn.Module, targets: Iterable[Target], *, setting: str) -> list[nn.Module]:
    """The submodules of ``model`` that ``targets`` name, outermost only, in ``named_modules`` order.

    A target is a module class (instances and subclasses match), a class name (``"Block"``:
    a class of that name in the module's MRO) or a module path as in ``named_modules``
    (``"backbone.layer1"``, mmengine's form). A module inside another matched module is left
    out (the outer one covers it).

    Raises:
        ValueError: a target matches no module; the message names it and the model's module classes.
    """
    root = _user_module(model)
    named = list(root.named_modules())
    paths = dict(named)
    hits: set[int] = set()
    for target in targets:
        if isinstance(target, type) and issubclass(target, nn.Module):
            found = [m for _, m in named if isinstance(m, target)]
        elif isinstance(target, str):
            found = [m for _, m in named if any(c.__name__ == target for c in type(m).__mro__)]
            if target in paths and target:
                found.append(paths[target])
        else:
            raise TypeError(
                f"{setting} takes module classes, class names or module paths, got {target!r} ({type(target).__name__})"
            )
        if not found:
            classes = sorted({type(m).__name__ for _, m in named})
            name = target.__name__ if isinstance(target, type) else target
            raise ValueError(
                f"{setting}: {name!r} matches no module of {type(root).__name__}; name one of its module classes "
                f"{classes} "
                "(or pass the class itself, or a module path such as 'blocks.0')"
            )
        hits.update(id(m) for m in found)
    chosen: list[nn.Module] = []
    covered: set[int] = set()
    for _, m in named:  # named_modules is pre-order: an outer module comes before its children
        if id(m) in covered:
            continue
        if id(m) in hits:
            chosen.append(m)
            covered.update(id(sub) for sub in m.modules())
    return chosen


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The class's forward, its activations recomputed in the backward pass (only while gradients are recorded)."""
    forward = type(self).forward
    if not torch.is_grad_enabled():
        return forward(self, *args, **kwargs)
    return checkpoint(forward, self, *args, use_reentrant=False, **kwargs)


def is_checkpointed(module: nn.Module) -> bool:
    """True when :func:`apply_activation_checkpointing` checkpoints ``module``'s forward."""
    forward = module.__dict__.get("forward")
    return isinstance(forward, types.MethodType) and forward.__func__ is _checkpointed_forward


def apply_activation_checkpointing(model: nn.Module, targets: Sequence[Target]) -> list[nn.Module]:
    """Checkpoint every submodule of ``model`` that ``targets`` name (classes, class names or module paths), in place.

    Called by :meth:`~trainwright.strategies.Strategy.prepare` after tensor parallelism and
    before compilation and sharding (torchtitan's order). Idempotent. Returns the checkpointed modules.

    Raises:
        ValueError: a target matches no module (see :func:`select_modules`), or a module already
            has its own instance-level ``forward`` (it would be lost).
    """
    if isinstance(targets, (str, type)):
        targets = [targets]
    if not targets:
        return []
    chosen = select_modules(model, targets, setting="activation_checkpointing")
    for module in chosen:
        if is_checkpointed(module):
            continue
        if "forward" in module.__dict__:
            raise ValueError(
                f"activation_checkpointing: the {type(module).__name__} module already has its own forward set on the "
                "instance; "
                "define forward on its class instead, or checkpoint it yourself with torch.utils.checkpoint.checkpoint"
            )
        vars(module)["forward"] = types.MethodType(_checkpointed_forward, module)
    return chosen


def remove_activation_checkpointing(model: nn.Module) -> None:
    """Undo :func:`apply_activation_checkpointing` on every submodule of ``model``."""
    for module in model.modules():
        if is_checkpointed(module):
            del module.forward


__all__ = ["apply_activation_checkpointing", "is_checkpointed", "remove_activation_checkpointing", "select_modules"]
