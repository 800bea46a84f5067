"""FLOPs and peaks: what the ``tflops`` and ``mfu`` fields of training records are computed from.

:class:`StepFlops` is one training iteration's count (taken once, by the ``flops`` hook, with
``torch.utils.flop_counter.FlopCounterMode``) with the batch it was counted on and the peak
it is compared with; :func:`flop_counter` is the mode it is counted with. :func:`peak_tflops`
looks a device's dense peak up in :data:`PEAKS`; :func:`matmul_precision` says which peak
column a run uses.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from trainwright.amp.precision import matmul_column

__all__ = [
    "FLOPS_KEYS",
    "FORMULAS",
    "NO_FLOPS",
    "PEAKS",
    "Peak",
    "StepFlops",
    "flop_counter",
    "matmul_precision",
    "peak_tflops",
]


def _sdpa(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return int(sdpa_flop_count(query_shape, key_shape, value_shape))


def _sdpa_backward(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    return int(sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape))


_aten = torch.ops.aten
#: Formulas torch's counter lacks: its CPU fused attention (counted as torch counts the CUDA kernels:
#: the two matmuls of the full score matrix, causal or not; the backward's four).
FORMULAS: dict[Any, Any] = {
    op: fn
    for name, fn in (
        ("_scaled_dot_product_flash_attention_for_cpu", _sdpa),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_backward),
    )
    if (op := getattr(_aten, name, None)) is not None
}


def _map(fn: Any, obj: Any) -> Any:
    """``fn`` applied to every leaf of nested tuples, lists and dicts (an op's arguments)."""
    if isinstance(obj, (tuple, list)):
        items = [_map(fn, x) for x in obj]
        return items if isinstance(obj, list) else torch.Size(items) if isinstance(obj, torch.Size) else tuple(items)
    if isinstance(obj, dict):
        return {k: _map(fn, v) for k, v in obj.items()}
    return fn(obj)


def _has_dtensor(obj: Any) -> bool:
    if isinstance(obj, (tuple, list)):
        return any(_has_dtensor(x) for x in obj)
    if isinstance(obj, dict):
        return any(_has_dtensor(x) for x in obj.values())
    return _is_dtensor(obj)


def _is_dtensor(x: Any) -> bool:
    return type(x).__name__ == "DTensor" and hasattr(
        x, "placements"
    )  # by name: only strategies/ and dist/ import torch.distributed


def _local_shape(x: Any) -> Any:
    """A tensor's shape on this device: a DTensor's global shape divided along its sharded dimensions (rank 0's, the
    larger, chunk)."""
    if not isinstance(x, torch.Tensor):
        return x
    if not _is_dtensor(x):
        return x.shape
    shape = list(x.shape)
    dtensor: Any = x
    for size, placement in zip(dtensor.device_mesh.shape, dtensor.placements):
        if placement.is_shard():
            shape[placement.dim] = -(-shape[placement.dim] // size)
    return torch.Size(shape)


def _per_device(formula: Any) -> Any:
    """``formula`` counting what this device computes: an op on DTensors (tensor parallelism) is counted on its local
    shards.

    The counter meets a DTensor op before DTensor splits it, with global shapes; the local
    shapes give this device's share. Ops on plain tensors are counted as torch counts them.
    """

    def count(*args: Any, out_val: Any = None, **kwargs: Any) -> Any:
        if _has_dtensor((args, kwargs)):
            args, kwargs, out_val = _map(
                _local_shape, (args, kwargs, out_val)
            )  # shapes pass through torch's formulas unchanged
        return formula(*args, out_val=out_val, **kwargs)

    count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode's custom_mapping convention: called with the op's arguments
    return count


def flop_counter() -> FlopCounterMode:
    """The ``torch.utils.flop_counter.FlopCounterMode`` a training iteration is counted with.

    It prints nothing, also counts CPU fused attention (:data:`FORMULAS`), and counts per
    device: an op on DTensors (tensor parallelism) by its local shards.
    """
    formulas = {**flop_registry, **{op: _raw(fn) for op, fn in FORMULAS.items()}}
    return FlopCounterMode(display=False, custom_mapping={op: _per_device(fn) for op, fn in formulas.items()})


def _raw(formula: Any) -> Any:
    """A shape formula made callable with the op's arguments (what torch's registry holds)."""

    def call(*args: Any, out_val: Any = None, **kwargs: Any) -> Any:
        args, kwargs, out_shape = _map(lambda x: x.shape if isinstance(x, torch.Tensor) else x, (args, kwargs, out_val))
        return formula(*args, out_shape=out_shape, **kwargs)

    return call


class Peak(NamedTuple):
    """Dense (no structured sparsity) peak TFLOP/s of one accelerator, per matmul precision; None: not published /
    not supported."""

    name: str
    pattern: str  # regular expression searched in the lower-cased torch.cuda.get_device_name()
    bf16: float | None
    fp16: float | None
    tf32: float | None  # None where the GPU has no TF32 tensor cores (float32 matmuls then run at the fp32 rate)
    fp32: float | None


#: Dense peaks from the vendors' datasheets and architecture whitepapers (the sparse figures halved),
#: bf16 / fp16 with float32 accumulation (what torch uses). The first pattern that matches wins:
#: more specific names come first. ``torch.cuda.get_device_name()`` spells the H100 SXM
#: "NVIDIA H100 80GB HBM3" and the A100 "NVIDIA A100-SXM4-80GB" / "NVIDIA A100 80GB PCIe".
PEAKS: tuple[Peak, ...] = (
    Peak("H100 NVL", r"\bh100\b.*\bnvl\b", 835.5, 835.5, 417.5, 60.0),
    Peak("H100 PCIe", r"\bh100\b.*\bpcie\b", 756.0, 756.0, 378.0, 51.2),
    Peak("H100 SXM", r"\bh100\b", 989.4, 989.4, 494.7, 66.9),
    Peak("H200 NVL", r"\bh200\b.*\bnvl\b", 835.5, 835.5, 417.5, 60.0),
    Peak("H200", r"\bg?h200\b", 989.4, 989.4, 494.7, 66.9),  # H200 SXM and GH200: the H100 SXM's compute
    Peak(
        "B200", r"\bb200\b", 2250.0, 2250.0, None, None
    ),  # tf32 / fp32 dense figures left out: not in the table, give peak_tflops
    Peak("A100", r"\ba100\b", 312.0, 312.0, 156.0, 19.5),  # SXM and PCIe alike
    Peak("A10G", r"\ba10g\b", 125.0, 125.0, 62.5, 31.2),  # no NVIDIA datasheet: the A10's (same GA102 configuration)
    Peak("A10", r"\ba10\b", 125.0, 125.0, 62.5, 31.2),
    Peak("L40S", r"\bl40s\b", 362.1, 362.1, 183.0, 91.6),
    Peak("L40", r"\bl40\b", 181.0, 181.0, 90.5, 90.5),
    Peak("L4", r"\bl4\b", 121.0, 121.0, 60.0, 30.3),
    Peak("RTX 4090", r"\brtx 4090\b", 165.2, 165.2, 82.6, 82.6),
    Peak("RTX 3090", r"\brtx 3090\b", 71.0, 71.0, 35.6, 35.6),
    Peak("V100S PCIe", r"\bv100s\b", None, 130.0, None, 16.4),  # Volta: no bf16 / tf32 tensor cores
    Peak("V100 PCIe", r"\bv100\b.*\bpcie\b", None, 112.0, None, 14.0),
    Peak("V100 SXM2", r"\bv100\b", None, 125.0, None, 15.7),
    Peak("T4", r"\bt4\b", None, 65.0, None, 8.1),
    Peak("MI300X", r"\bmi300x\b", 1307.4, 1307.4, 653.7, 163.4),
)

_COLUMNS = ("bf16", "fp16", "tf32", "fp32")


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The dense peak TFLOP/s of ``device_name`` (``torch.cuda.get_device_name()``) at ``precision``; None when unknown.

    Args:
        device_name: The accelerator's name, any case (``"NVIDIA H100 80GB HBM3"``).
        precision: ``"bf16"``, ``"fp16"``, ``"tf32"`` or ``"fp32"`` (see :func:`matmul_precision`);
            ``"tf32"`` on a GPU without TF32 tensor cores is its fp32 peak.
    """
    if precision not in _COLUMNS:
        return None
    name = device_name.lower()
    for peak in PEAKS:
        if re.search(peak.pattern, name):
            value = getattr(peak, precision)
            if value is None and precision == "tf32":
                value = peak.fp32
            return float(value) if value is not None else None
    return None


def matmul_precision(autocast_dtype: torch.dtype | None, param_dtype: torch.dtype | None) -> str:
    """The peak column a run's matmuls use: ``"bf16"``, ``"fp16"``, ``"tf32"``, ``"fp32"`` (or ``"fp64"``: no column).

    The autocast dtype when the run autocasts to bfloat16 / float16, else the parameters'
    dtype; float32 matmuls count as TF32 when torch allows it
    (``torch.set_float32_matmul_precision("high")`` or ``"medium"``), else as fp32. A run's
    precision answers it itself (:meth:`trainwright.amp.Precision.peak_column`); this is the
    same rule for a loop without one.
    """
    return matmul_column(autocast_dtype, param_dtype)


class StepFlops(NamedTuple):
    """The FLOPs of one training iteration on this process, counted once.

    Attributes:
        flops: Floating-point operations of the counted iteration's forward and backward
            (matmuls, convolutions, attention: what ``torch.utils.flop_counter`` counts).
        samples: Samples of the batch it was counted on (None: unknown); a logged batch of
            another size scales the count by its sample count.
        peak_tflops: The device's peak TFLOP/s (None: unknown, no ``mfu``).
    """

    flops: int
    samples: int | None
    peak_tflops: float | None

    def tflops(self, samples: int | None, seconds: float) -> float:
        """Achieved TFLOP/s of an iteration on a batch of ``samples`` that took ``seconds`` on average."""
        flops: Any = self.flops
        if samples is not None and self.samples:
            flops = flops * samples / self.samples
        return float(flops) / seconds / 1e12

    def values(self) -> dict[str, float]:
        """The count as the metric store's values (:data:`FLOPS_KEYS`; 0 for an unknown sample count or peak),
        recorded by the flops hook."""
        return {FLOPS_KEYS[0]: self.flops, FLOPS_KEYS[1]: self.samples or 0, FLOPS_KEYS[2]: self.peak_tflops or 0.0}


#: The metric store's names of a :class:`StepFlops` (the log lines read them, records do not show them); a count of 0:
#: none.
FLOPS_KEYS = ("flops/step", "flops/samples", "flops/peak_tflops")

#: What the flops hook records when this ``train()`` has no count (the lines then carry no ``tflops`` / ``mfu``).
NO_FLOPS: dict[str, float] = dict.fromkeys(FLOPS_KEYS, 0)
