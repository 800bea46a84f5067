"""Model wrappers that keep the step contract (``train_step`` / ``val_step`` / ``test_step``).

mmengine's ``MMDistributedDataParallel`` copies ``BaseModel.train_step`` with itself as the
forward callable. Here the model's own ``train_step`` runs: the wrapper tells the model, when
it wraps it, that its training forward goes through the wrapper
(:meth:`~trainwright.BaseModel.set_forward_caller`), so DDP sees every forward and
synchronises gradients — also when a user calls ``wrapper.train_step`` directly — and nothing
is copied.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def unused_parameters(outputs: Any, model: nn.Module) -> list[str]:
    """Names of ``model``'s trainable parameters that no tensor of ``outputs`` depends on (mmengine's
    ``detect_anomalous_params``).

    Walks the autograd graph back from every tensor in ``outputs`` (a tensor, or a dict / list
    of them) to the parameters' gradient accumulators.
    """
    roots: list[Any] = [t.grad_fn for t in _tensors(outputs) if t.grad_fn is not None]
    reached: set[int] = set()
    seen: set[Any] = set()
    while roots:
        fn = roots.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)  # an AccumulateGrad node holds its parameter
        if isinstance(variable, torch.Tensor):
            reached.add(id(variable))
        roots.extend(next_fn for next_fn, _ in fn.next_functions)
    return [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in reached]


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


class DistributedDataParallelWrapper(DistributedDataParallel):
    """``DistributedDataParallel`` with the model's step methods (mmengine's ``MMDistributedDataParallel``).

    ``train_step`` is the wrapped model's, its forward in ``"loss"`` mode running through this
    wrapper; ``val_step`` / ``test_step`` call the model itself, without gradient
    synchronisation, as in mmengine.

    Args:
        module: The model.
        detect_anomalous_params: After every training forward, warn naming the trainable
            parameters the losses do not depend on (they get no gradient; DDP without
            ``find_unused_parameters=True`` then fails at the next step). A debugging aid:
            it walks the autograd graph at every step.
        **kwargs: ``DistributedDataParallel``'s arguments.
    """

    def __init__(self, module: nn.Module, detect_anomalous_params: bool = False, **kwargs: Any) -> None:
        super().__init__(module, **kwargs)
        self.detect_anomalous_params = detect_anomalous_params
        set_caller = getattr(module, "set_forward_caller", None)
        if set_caller is not None:
            set_caller(self)
        routes = getattr(module, "routes_train_forward", None)
        if callable(routes) and not routes():
            warnings.warn(
                f"{type(module).__name__} overrides train_step, so DDP does not see the forwards it makes (self(...), "
                "a submodule) and "
                "wrapper.train_step would not synchronise the gradients. Train it with Trainer(strategy='ddp'), which "
                "averages them "
                "before each update; or send every training forward through `self.forward_caller or self` and override "
                "routes_train_forward() to return True.",
                UserWarning,
                stacklevel=2,
            )

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """DDP's forward; with :attr:`detect_anomalous_params`, then the check of the outputs."""
        outputs = super().forward(*inputs, **kwargs)
        if self.detect_anomalous_params and torch.is_grad_enabled():
            unused = unused_parameters(outputs, self.module)
            if unused:
                warnings.warn(
                    f"detect_anomalous_params: the loss does not depend on the parameters {unused}: they get no "
                    "gradient. "
                    "Use them in the loss, freeze them (requires_grad=False), or pass find_unused_parameters=True.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return outputs

    @property
    def train_step(self) -> Callable[[Any, Any], Any]:
        """The wrapped model's ``train_step`` (its forward goes through DDP)."""
        return self.module.train_step

    @property
    def val_step(self) -> Callable[[Any], Any]:
        """The wrapped model's ``val_step``."""
        return self.module.val_step

    @property
    def test_step(self) -> Callable[[Any], Any]:
        """The wrapped model's ``test_step``."""
        return self.module.test_step


#: mmengine's name, for ported code (``from trainwright.model.wrappers import MMDistributedDataParallel``).
MMDistributedDataParallel = DistributedDataParallelWrapper
