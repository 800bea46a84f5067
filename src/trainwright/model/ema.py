"""Exponential moving average of a model's weights, updated without host synchronisation."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from trainwright.dist.shards import is_sharded, load_into, locals_of


class ExponentialMovingAverage:
    """A float32 running average of a model's parameters (and optionally its buffers).

    Follows the mmengine convention, where ``momentum`` is the weight of the *new* value::

        averaged = (1 - momentum) * averaged + momentum * source

    The first update copies the source; afterwards every ``interval``-th call averages.
    Entries are keyed like ``model.state_dict()``, so :attr:`averaged` (and the
    ``"averaged"`` entry of :meth:`state_dict`) loads straight into the model with
    ``model.load_state_dict``. Floating entries are kept in at least float32 even when the
    model trains in bf16 / fp16, so small updates are not rounded away. Integer buffers
    (``num_batches_tracked``) are copied, never averaged.

    Updates use ``torch._foreach_*`` kernels on tensors that stay where they are: with the
    average on the model's device, :meth:`update_parameters` never waits for the device.

    A sharded model (FSDP2: parameters are DTensors) keeps a sharded average: each process
    averages its own shard (the average is elementwise, so the shards together are the
    average of the whole). :meth:`state_dict` holds those DTensors, which a sharded checkpoint
    writes with the model's shards (DCP), so it loads at any world size and into an unsharded
    model; :meth:`load_state_dict` takes DTensors or whole tensors.

    Args:
        model: The module to average (the user's module, not a DDP / compile wrapper, so that
            the keys match its checkpoint).
        momentum: Weight of the new value, in (0, 1]. mmengine's default 0.0002 corresponds
            to a "decay" of 0.9998.
        update_buffers: Average floating buffers too (e.g. BatchNorm running stats); if
            False they are copied from the source at every update.
        interval: Average every ``interval`` calls (the first call always copies).
        device: Where to keep the average; the model's devices by default. A device other
            than the model's costs a transfer, and for CUDA → CPU a synchronisation, per
            update.
        anneal: A larger momentum early on, annealed to ``momentum`` (the average forgets the
            first, random weights quickly), with ``gamma``: ``"linear"`` is mmengine's
            ``MomentumAnnealingEMA`` (``max(momentum, gamma / (gamma + steps))``), ``"exp"``
            mmdet's ``ExpMomentumEMA`` (``(1 - momentum) * exp(-(1 + steps) / gamma) + momentum``),
            ``steps`` counting the updates; None (default): ``momentum`` throughout.
        gamma: The annealing's time scale in updates (mmengine's default 100, mmdet's 2000).
    """

    def __init__(
        self,
        model: nn.Module,
        momentum: float = 0.0002,
        update_buffers: bool = False,
        interval: int = 1,
        device: torch.device | str | None = None,
        anneal: str | None = None,
        gamma: float = 100.0,
    ) -> None:
        if anneal not in (None, "linear", "exp"):
            raise ValueError(
                "EMA anneal must be None, 'linear' (mmengine's MomentumAnnealingEMA) or 'exp' (mmdet's "
                f"ExpMomentumEMA), got {anneal!r}"
            )
        if anneal is not None and not float(gamma) > 0:
            raise ValueError(f"EMA gamma must be > 0 (the annealing's time scale in updates), got {gamma!r}")
        self.anneal = anneal
        self.gamma = float(gamma)
        if not 0.0 < float(momentum) <= 1.0:
            raise ValueError(
                f"EMA momentum must be in (0, 1] (the weight of the new value, e.g. 0.0002), got {momentum}; to "
                "convert from a decay d use momentum = 1 - d"
            )
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"EMA interval must be an int >= 1, got {interval!r}")
        self.momentum = float(momentum)
        self.update_buffers = bool(update_buffers)
        self.interval = interval
        self.device = torch.device(device) if device is not None else None
        #: Calls to :meth:`update_parameters` so far (a Python int: reading it costs no sync).
        self.steps = 0
        self.averaged: dict[str, torch.Tensor] = {}
        self._avg_keys: list[str] = []
        self._copy_keys: list[str] = []
        self._backup: list[torch.Tensor] | None = None
        with torch.no_grad():
            for key, tensor in model.state_dict(keep_vars=True).items():
                t = tensor.detach()
                averaged = isinstance(tensor, nn.Parameter) or self.update_buffers
                if t.is_floating_point() or t.is_complex():
                    dtype = torch.promote_types(t.dtype, torch.float32)
                else:
                    dtype, averaged = t.dtype, False
                self.averaged[key] = t.to(device=self.device or t.device, dtype=dtype, copy=True)
                (self._avg_keys if averaged else self._copy_keys).append(key)
        #: Whether the model is sharded (DTensor entries): the foreach kernels then run on each process's shards.
        self.sharded = any(is_sharded(t) for t in self.averaged.values())
        self._avg = self._locals([self.averaged[k] for k in self._avg_keys])
        self._copied = self._locals([self.averaged[k] for k in self._copy_keys])

    def update_parameters(self, model: nn.Module) -> None:
        """Fold the model's current weights into the average (one call per training step)."""
        source = self._source(model)
        src_avg = self._locals([source[k] for k in self._avg_keys])
        with torch.no_grad():
            if self.steps == 0:
                if src_avg:
                    torch._foreach_copy_(self._avg, src_avg)
            elif self.steps % self.interval == 0 and src_avg:
                torch._foreach_lerp_(
                    self._avg, [_like(s, a) for s, a in zip(src_avg, self._avg)], self.momentum_at(self.steps)
                )
            if self._copied:
                torch._foreach_copy_(self._copied, self._locals([source[k] for k in self._copy_keys]))
        self.steps += 1

    def momentum_at(self, steps: int) -> float:
        """The weight of the new value in the update made after ``steps`` earlier ones (a Python float: no device
        work)."""
        if self.anneal == "linear":
            return max(self.momentum, self.gamma / (self.gamma + steps))
        if self.anneal == "exp":
            return (1 - self.momentum) * math.exp(-(1 + steps) / self.gamma) + self.momentum
        return self.momentum

    def sync_from(self, model: nn.Module) -> None:
        """Overwrite the average with the model's current weights (``steps`` is unchanged)."""
        source = self._source(model)
        with torch.no_grad():
            torch._foreach_copy_(
                self._locals(list(self.averaged.values())), self._locals([source[k] for k in self.averaged])
            )

    def copy_to(self, model: nn.Module) -> None:
        """Write the averaged weights into ``model`` for good (e.g. before exporting it)."""
        targets = self._targets(model)
        with torch.no_grad():
            torch._foreach_copy_(targets, self._locals(list(self.averaged.values())))

    def swap_in(self, model: nn.Module) -> None:
        """Put the averaged weights into ``model``, keeping a copy of its own to restore.

        Raises:
            RuntimeError: If the averaged weights are already swapped in.
        """
        if self._backup is not None:
            raise RuntimeError(
                "The EMA weights are already swapped into the model; call swap_out(model) before swapping in again"
            )
        targets = self._targets(model)
        self._backup = [t.clone() for t in targets]
        with torch.no_grad():
            torch._foreach_copy_(targets, self._locals(list(self.averaged.values())))

    def swap_out(self, model: nn.Module) -> None:
        """Restore the weights ``model`` had before :meth:`swap_in`, bit for bit.

        Raises:
            RuntimeError: If nothing was swapped in.
        """
        if self._backup is None:
            raise RuntimeError(
                "swap_out(model) called but the EMA weights are not swapped in; call swap_in(model) first"
            )
        targets = self._targets(model)
        with torch.no_grad():
            torch._foreach_copy_(targets, self._backup)
        self._backup = None

    @property
    def swapped_in(self) -> bool:
        """Whether the averaged weights are currently in the model (see :meth:`swap_in`)."""
        return self._backup is not None

    @contextmanager
    def applied_to(self, model: nn.Module) -> Iterator[nn.Module]:
        """Context manager: the model holds the averaged weights inside, its own after."""
        self.swap_in(model)
        try:
            yield model
        finally:
            self.swap_out(model)

    def state_dict(self) -> dict[str, Any]:
        """The step count and the averaged tensors (references, as ``nn.Module.state_dict``: a sharded model's are
        DTensors, like its own state dict's)."""
        return {"steps": self.steps, "averaged": dict(self.averaged)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; tensors keep this average's device and dtype.

        Raises:
            KeyError: If the saved keys differ from this model's (names the differences).
            ValueError: If a saved tensor's shape differs from this model's.
        """
        saved = state_dict["averaged"]
        missing = sorted(set(self.averaged) - set(saved))
        unexpected = sorted(set(saved) - set(self.averaged))
        if missing or unexpected:
            raise KeyError(
                f"The EMA state does not match the model: missing keys {missing}, unexpected keys {unexpected}; "
                "build the EMA from the same model architecture that was saved"
            )
        bad = [
            f"{k}: saved {tuple(saved[k].shape)}, model {tuple(v.shape)}"
            for k, v in self.averaged.items()
            if tuple(saved[k].shape) != tuple(v.shape)
        ]
        if bad:
            raise ValueError(
                "Shape mismatch loading the EMA state (build the EMA from the same model that was saved): "
                + "; ".join(bad)
            )
        with torch.no_grad():
            for key, tensor in self.averaged.items():
                load_into(tensor, saved[key])
        self.steps = int(state_dict["steps"])

    def _source(self, model: nn.Module) -> dict[str, torch.Tensor]:
        source = model.state_dict(keep_vars=True)
        if len(source) != len(self.averaged) or any(k not in source for k in self.averaged):
            missing = sorted(set(self.averaged) - set(source))
            unexpected = sorted(set(source) - set(self.averaged))
            raise KeyError(
                f"The model's state_dict keys changed since the EMA was built: missing {missing}, new {unexpected}; "
                "pass the same (unwrapped) module the EMA was built from"
            )
        return source

    def _targets(self, model: nn.Module) -> list[torch.Tensor]:
        source = self._source(model)
        return self._locals([source[k].detach() for k in self.averaged])

    def _locals(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """``tensors`` as the foreach kernels take them: each DTensor's local shard (a view: in-place updates reach
        it)."""
        return locals_of(tensors) if self.sharded else tensors

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(momentum={self.momentum}, interval={self.interval}, "
            f"update_buffers={self.update_buffers}, steps={self.steps})"
        )


def _like(src: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``src`` with ``ref``'s dtype and device (no copy when they already match)."""
    if src.dtype == ref.dtype and src.device == ref.device:
        return src
    return src.to(device=ref.device, dtype=ref.dtype)
