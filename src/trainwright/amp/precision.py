"""Precision: the one object that says how a step handles dtypes.

``Precision`` (fp32) does nothing; ``MixedPrecision`` enters autocast around the forward
pass and, for float16, owns the ``torch.amp.GradScaler``. The optim wrapper and the model's
train step call it; there is no second copy of the training step for AMP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch

_NULL = contextlib.nullcontext()

#: Trainer ``precision=`` names → autocast dtype (None: full precision).
PRECISIONS: dict[str, torch.dtype | None] = {
    "32": None,
    "fp32": None,
    "32-true": None,
    "bf16-mixed": torch.bfloat16,
    "16-mixed": torch.float16,
}


class Precision:
    """Full precision (float32): no autocast, no loss scaling."""

    name = "32"
    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for the forward pass and loss computation."""
        return _NULL

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Back-propagate ``loss`` (scaled first when a scaler is active)."""
        loss.backward(**kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale before clipping (no-op here)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        """Step the optimizer (float16: skipped when gradients are not finite)."""
        optimizer.step(**kwargs)

    @property
    def loss_scale(self) -> torch.Tensor | None:
        """The current loss scale, or None when no scaler is used."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Scaler state (empty for full precision)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the scaler state."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class MixedPrecision(Precision):
    """Autocast mixed precision; float16 adds a GradScaler, bfloat16 does not need one.

    Args:
        dtype: ``torch.float16`` / ``"float16"`` or ``torch.bfloat16`` / ``"bfloat16"``.
        device_type: ``"cpu"`` or ``"cuda"`` (the device of the parameters).
        loss_scale: float16 only: ``"dynamic"`` (default), a fixed float, or a dict of
            ``torch.amp.GradScaler`` arguments (``init_scale``, ``growth_factor``,
            ``backoff_factor``, ``growth_interval``).
    """

    def __init__(self, dtype: torch.dtype | str = torch.bfloat16, device_type: str = "cpu", loss_scale: str | float | Mapping[str, Any] = "dynamic") -> None:
        if isinstance(dtype, str):
            if dtype not in ("float16", "bfloat16", "half"):
                raise ValueError(f"Mixed precision dtype must be 'float16' or 'bfloat16', got {dtype!r}")
            dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float16
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"Mixed precision dtype must be torch.float16 or torch.bfloat16, got {dtype}")
        self.dtype = dtype
        self.device_type = device_type
        self.name = "bf16-mixed" if dtype == torch.bfloat16 else "16-mixed"
        self._autocast_kwargs = dict(device_type=device_type, dtype=dtype)
        self.scaler = None
        self._static_scale: float | None = None
        if dtype == torch.float16:
            if loss_scale == "dynamic":
                kwargs: dict[str, Any] = {}
            elif isinstance(loss_scale, (int, float)):
                kwargs = dict(init_scale=float(loss_scale), growth_factor=1.0, backoff_factor=1.0, growth_interval=2**31 - 1)
                self._static_scale = float(loss_scale)
            elif isinstance(loss_scale, Mapping):
                allowed = {"init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"}
                bad = set(loss_scale) - allowed
                if bad:
                    raise ValueError(f"Unknown loss_scale keys {sorted(bad)}; allowed: {sorted(allowed)}")
                kwargs = dict(loss_scale)
            else:
                raise ValueError(f"loss_scale must be 'dynamic', a number or a dict of GradScaler arguments, got {loss_scale!r}")
            # The device must be named: a bare GradScaler() means CUDA and disables itself on CPU.
            self.scaler = torch.amp.GradScaler(device_type, **kwargs)

    def autocast(self) -> contextlib.AbstractContextManager:
        """``torch.autocast`` for the forward pass and loss."""
        return torch.autocast(**self._autocast_kwargs)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Scale (float16) and back-propagate."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale gradients in place so clipping sees their true values."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        """Step unless float16 gradients overflowed; then update the loss scale."""
        if self.scaler is None:
            optimizer.step(**kwargs)
            return
        self.scaler.step(optimizer, **kwargs)
        self.scaler.update()

    @property
    def loss_scale(self) -> torch.Tensor | None:
        """The GradScaler's current scale (a tensor; no sync)."""
        if self.scaler is None or self.scaler._scale is None:  # noqa: SLF001 - only way to read it without a sync
            return None
        return self.scaler._scale  # noqa: SLF001

    def state_dict(self) -> dict[str, Any]:
        """The GradScaler state (float16) or nothing (bfloat16)."""
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the GradScaler state."""
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def build_precision(precision: str | Precision | None, device_type: str = "cpu") -> Precision:
    """Build a precision object from a Trainer-style name (``"32"``, ``"bf16-mixed"``, ``"16-mixed"``)."""
    if isinstance(precision, Precision):
        return precision
    if precision is None:
        return Precision()
    key = str(precision)
    if key not in PRECISIONS:
        from trainwright.registry import did_you_mean

        raise ValueError(f"Unknown precision {precision!r}.{did_you_mean(key, list(PRECISIONS))} Use one of {list(PRECISIONS)}")
    dtype = PRECISIONS[key]
    return Precision() if dtype is None else MixedPrecision(dtype, device_type)
