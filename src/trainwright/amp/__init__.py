"""Precision: one class per precision (fp32, bf16/fp16 autocast, bf16-true, float8) by name; mmcv fp16 utilities.

Where to add a precision: a :class:`Precision` subclass in a module of this package, plus
``register_precision(name, factory)`` in that module and its import below.
"""

from typing import TYPE_CHECKING

from trainwright.amp.float8 import Float8Precision
from trainwright.amp.precision import (
    PRECISIONS,
    MixedPrecision,
    Precision,
    PrecisionFactory,
    build_precision,
    register_precision,
    registered_precisions,
)
from trainwright.amp.true_precision import TruePrecision
from trainwright.utils.lazy import lazy_names

if TYPE_CHECKING:
    from trainwright.amp.fp16_utils import (
        auto_fp16,
        cast_tensor_type,
        force_fp32,
        patch_forward_method,
        patch_norm_fp32,
        wrap_fp16_model,
    )

#: Loaded on first use (PEP 562): a run keeps only the code it uses.
__getattr__, __dir__ = lazy_names(__name__, __file__, globals())

__all__ = [
    "PRECISIONS",
    "Float8Precision",
    "MixedPrecision",
    "Precision",
    "PrecisionFactory",
    "TruePrecision",
    "auto_fp16",
    "build_precision",
    "cast_tensor_type",
    "force_fp32",
    "patch_forward_method",
    "patch_norm_fp32",
    "register_precision",
    "registered_precisions",
    "wrap_fp16_model",
]
