"""Mixed precision: the precision plugin (fp32 / bf16 / fp16 + GradScaler) and mmcv-compatible fp16 utilities."""

from trainwright.amp.fp16_utils import (
    auto_fp16,
    cast_tensor_type,
    force_fp32,
    patch_forward_method,
    patch_norm_fp32,
    wrap_fp16_model,
)
from trainwright.amp.float8 import Float8Precision
from trainwright.amp.precision import PRECISIONS, MixedPrecision, Precision, build_precision

__all__ = [
    "PRECISIONS",
    "Float8Precision",
    "MixedPrecision",
    "Precision",
    "auto_fp16",
    "build_precision",
    "cast_tensor_type",
    "force_fp32",
    "patch_forward_method",
    "patch_norm_fp32",
    "wrap_fp16_model",
]
