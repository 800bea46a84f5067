"""Mixed precision: mmcv-compatible fp16 utilities (and, later, the precision plugin)."""

from trainwright.amp.fp16_utils import (
    auto_fp16,
    cast_tensor_type,
    force_fp32,
    patch_forward_method,
    patch_norm_fp32,
    wrap_fp16_model,
)

__all__ = [
    "auto_fp16",
    "cast_tensor_type",
    "force_fp32",
    "patch_forward_method",
    "patch_norm_fp32",
    "wrap_fp16_model",
]
