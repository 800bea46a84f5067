"""``precision="float8"``: float8 matmuls in the Linear layers (torchao's float8 training), bfloat16 autocast elsewhere.

Needs a CUDA GPU of compute capability 8.9 or newer and the optional ``torchao`` package;
both are checked when the precision is built, so a run that cannot use float8 fails at start.
The Linear layers are swapped in place when the strategy prepares the model (before
parallelizing, compiling and sharding); their parameters and state-dict keys stay those of
``nn.Linear``, so checkpoints load with or without float8.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from trainwright.amp.precision import MixedPrecision, register_precision

#: What float8 needs, named in every refusal.
_NEEDS = (
    "precision='float8' needs a CUDA GPU of compute capability 8.9 or newer (H100, H200, L4, L40S, RTX 4090, ...) and "
    "torchao (pip install torchao)"
)


def check_float8_support(device_type: str) -> None:
    """Raise a ``RuntimeError`` naming what is missing when float8 training cannot run here."""
    if device_type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(
            f"{_NEEDS}; this run's device is {device_type!r}. Use precision='bf16-mixed' on this machine."
        )
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        raise RuntimeError(
            f"{_NEEDS}; this GPU ({torch.cuda.get_device_name()}) has compute capability {major}.{minor}. Use "
            "precision='bf16-mixed' on it."
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"{_NEEDS}; torchao is not importable here ({e}). Install it: pip install torchao") from e


def default_module_filter(module: nn.Module, fqn: str) -> bool:
    """Convert a Linear layer whose input and output sizes are multiples of 16 (what float8 matmuls require)."""
    return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


class Float8Precision(MixedPrecision):
    """float8 training of the Linear layers (torchao), with bfloat16 autocast for the rest of the forward pass.

    Args:
        device_type: Must be ``"cuda"`` (checked, with :func:`check_float8_support`).
        recipe: torchao's float8 recipe name: ``"tensorwise"`` (default), ``"rowwise"``,
            ``"rowwise_with_gw_hp"``.
        module_filter: ``(module, fully_qualified_name) -> bool``: which Linear layers to
            convert; default :func:`default_module_filter`.
    """

    def __init__(
        self,
        device_type: str = "cuda",
        recipe: str = "tensorwise",
        module_filter: Callable[[nn.Module, str], bool] | None = None,
    ) -> None:
        check_float8_support(device_type)
        super().__init__(torch.bfloat16, device_type)
        self.name = "float8"
        self.recipe = recipe
        self.module_filter = module_filter or default_module_filter

    def convert_module(self, model: nn.Module) -> None:
        """Swap the chosen ``nn.Linear`` layers for torchao's ``Float8Linear``, in place; warn when none qualifies."""
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        before = sum(isinstance(m, nn.Linear) for m in model.modules())
        convert_to_float8_training(
            model, config=Float8LinearConfig.from_recipe_name(self.recipe), module_filter_fn=self.module_filter
        )
        converted = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
        if converted == 0:
            warnings.warn(
                f"precision='float8' converted none of the model's {before} Linear layers (sizes must be multiples of "
                "16, and the module_filter must accept them): "
                "the run trains in bf16-mixed only.",
                UserWarning,
                stacklevel=2,
            )

    def check_setup(self, *, compiled: bool) -> None:
        """Warn when the model is not compiled: float8's scaling and casts then run as kernels of their own."""
        if not compiled:
            warnings.warn(
                "precision='float8' without compilation: float8's scaling and casts run as separate kernels, "
                "which made a GPT-2-small step 5x slower than bf16-mixed on an H200 (docs/benchmarks.md). "
                "Compile the repeated blocks: compile=dict(regions=['Block']).",
                UserWarning,
                stacklevel=3,
            )

    def peak_column(self, param_dtype: torch.dtype | None) -> str:
        """``"bf16"``: MFU against the bfloat16 peak (float8's own peak would hide the bf16 rest of the step)."""
        return "bf16"

    def clone(self) -> Float8Precision:
        """A fresh object with the same settings (one per optimizer)."""
        return Float8Precision(self.device_type, self.recipe, self.module_filter)

    def __repr__(self) -> str:
        return f"Float8Precision(recipe={self.recipe!r})"


register_precision("float8", Float8Precision)
