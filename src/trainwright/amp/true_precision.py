"""``precision="bf16-true"`` (Lightning's): weights, activations and gradients in bfloat16; no autocast, no loss scaler.

The model is cast when the strategy prepares it, so the optimizer and its state are bfloat16
too: half the memory of ``"bf16-mixed"``, with bfloat16 rounding in every update. Forward hooks
(torch's public ones) cast float inputs to bfloat16 and bfloat16 outputs back to float32.
This module is the whole precision: the class and its registration.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainwright.amp.casting import cast_tensor_type
from trainwright.amp.precision import Precision, register_precision

__all__ = ["TruePrecision"]


class _CastInputs:
    """Forward pre-hook: the floating-point tensors among the arguments to ``dtype``.

    A class rather than a closure, so the model stays picklable.
    """

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return cast_tensor_type(args, None, self.dtype), cast_tensor_type(kwargs, None, self.dtype)


class _OutputsToFloat32:
    """Forward hook: the outputs' ``dtype`` tensors (nested in containers too) back to float32."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        return cast_tensor_type(output, self.dtype, torch.float32)


class TruePrecision(Precision):
    """Train in one low dtype end to end: weights, activations, gradients and optimizer state (no autocast, no scaler).

    Args:
        dtype: ``torch.bfloat16`` (``"bf16-true"``). float16 is refused: without a loss
            scaler its gradients underflow; use ``"16-mixed"``.
        device_type: The device type of the parameters (kept for :meth:`clone`).

    Raises:
        ValueError: ``dtype`` is not ``torch.bfloat16``.
    """

    plain = False
    dtype: torch.dtype

    def __init__(self, dtype: torch.dtype = torch.bfloat16, device_type: str = "cpu") -> None:
        if dtype is not torch.bfloat16:
            raise ValueError(
                f"TruePrecision trains in torch.bfloat16 only, got {dtype!r}: float16 gradients underflow "
                "without a loss scaler. Use precision='16-mixed' (autocast + GradScaler) for float16, "
                "or precision='bf16-true'."
            )
        self.dtype = dtype
        self.device_type = str(device_type)
        self.name = "bf16-true"

    def convert_module(self, model: nn.Module) -> None:
        """Cast the model's floating-point parameters and buffers to the dtype (in place); hook its inputs, outputs."""
        model.to(self.dtype)
        model.register_forward_pre_hook(_CastInputs(self.dtype), with_kwargs=True)
        model.register_forward_hook(_OutputsToFloat32(self.dtype))

    def agrees_with(self, other: Precision) -> bool:
        """Only another true precision of the same dtype: an autocast precision keeps float32 weights."""
        return isinstance(other, TruePrecision) and other.dtype == self.dtype

    def deepspeed_config(self) -> dict[str, Any]:
        """DeepSpeed's ``bf16`` section (its engine then keeps the weights in bfloat16)."""
        return {"bf16": {"enabled": True}}

    def clone(self) -> TruePrecision:
        """A fresh object with the same settings (one per optimizer)."""
        return TruePrecision(self.dtype, self.device_type)

    def __repr__(self) -> str:
        return f"TruePrecision({self.name!r})"


register_precision("bf16-true", lambda device_type: TruePrecision(torch.bfloat16, device_type))
