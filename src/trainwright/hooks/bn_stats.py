"""BatchNorm statistics recomputed over batches at fixed weights: ``update_bn`` (torch's rule) for SWAHook and
PreciseBNHook."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def update_bn(batches: Iterable[Any], model: nn.Module, forward: Any) -> None:
    """``torch.optim.swa_utils.update_bn`` with the batch passed by ``forward(model, batch)``.

    Resets every BatchNorm layer's running statistics, sets its momentum to None (a
    cumulative average over the batches), runs every batch through ``model`` in training mode
    without gradients, then restores the momenta and the model's mode. Does nothing for a
    model without BatchNorm layers.
    """
    momenta: dict[nn.modules.batchnorm._BatchNorm, float | None] = {}
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    with torch.no_grad():
        for batch in batches:
            forward(model, batch)
    for module, momentum in momenta.items():
        module.momentum = momentum
    model.train(was_training)


def forward_for_stats(model: nn.Module, batch: Any) -> None:
    """A batch through a trainwright model the way training feeds it (its data preprocessor, ``mode="tensor"``); else
    ``model(batch)``."""
    preprocess = getattr(model, "data_preprocessor", None)
    run = getattr(model, "run_forward", None)
    if preprocess is not None and run is not None:
        run(preprocess(batch, True), "tensor")
    else:
        model(batch[0] if isinstance(batch, (list, tuple)) else batch)
