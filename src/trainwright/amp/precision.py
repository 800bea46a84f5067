"""Precision: the one object that says how a training step handles dtypes.

``Precision`` (fp32) does nothing; ``MixedPrecision`` enters autocast around the forward and
loss and, for float16, owns the ``torch.amp.GradScaler``. The optim wrapper's strategy calls it
(``backward``, ``unscale_``, ``optimizer_step``): one training step for every precision. The
optim builder, the strategies and the hooks ask a precision what they need (``plain``,
``fsdp_mixed_precision()``, ``peak_column()``, ...), never its dtype, scaler or name; names map
to precisions through :func:`register_precision`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

_NULL = contextlib.nullcontext()

#: The built-in autocast names → their autocast dtype (None: full precision). Kept for compatibility:
#: every name ``precision=`` accepts, these and the registered ones, is listed by :func:`registered_precisions`.
PRECISIONS: dict[str, torch.dtype | None] = {
    "32": None,
    "fp32": None,
    "32-true": None,
    "bf16-mixed": torch.bfloat16,
    "16-mixed": torch.float16,
}

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,  # mmengine's AmpOptimWrapper(dtype="float32" | "float64")
}
_NAMES = {
    torch.float16: "16-mixed",
    torch.bfloat16: "bf16-mixed",
    torch.float32: "32-autocast",
    torch.float64: "64-autocast",
}
_SCALER_KEYS = {"init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"}


def matmul_column(autocast_dtype: torch.dtype | None, param_dtype: torch.dtype | None) -> str:
    """The peak column a run's matmuls use: ``"bf16"``, ``"fp16"``, ``"tf32"``, ``"fp32"`` (or ``"fp64"``: no column).

    The autocast dtype when the run autocasts to bfloat16 / float16, else the parameters'
    dtype; float32 matmuls count as TF32 when torch allows it
    (``torch.set_float32_matmul_precision("high")`` or ``"medium"``), else as fp32.
    """
    dtype = autocast_dtype if autocast_dtype in (torch.bfloat16, torch.float16) else param_dtype
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if dtype == torch.float64:
        return "fp64"
    return "tf32" if torch.get_float32_matmul_precision() != "highest" else "fp32"


def _warn_ignored_scaler(state: Mapping[str, Any], name: str) -> None:
    if state.get("scaler"):
        warnings.warn(
            "The checkpoint holds GradScaler state from a float16 ('16-mixed') run, but this run uses precision "
            f"{name!r}; "
            "the loss-scale state is ignored. Resume with precision='16-mixed' to keep it.",
            RuntimeWarning,
            stacklevel=3,
        )


class Precision:
    """Full precision (float32): no autocast, no loss scaling."""

    name = "32"
    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None
    #: Whether :meth:`autocast` enters a context (decided when the object is built).
    autocasts = False
    #: True for plain float32 training (no autocast, no scaler, no cast weights): an optim wrapper
    #: that brings its own precision (``AmpOptimWrapper``) keeps it under a plain run precision,
    #: and a plain wrapper adopts a run precision that is not plain.
    plain = True

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for the forward pass and loss computation."""
        return _NULL

    def convert_module(self, model: torch.nn.Module) -> None:
        """Convert the model in place before it is parallelized and compiled; nothing here.

        float8 swaps its Linear layers, ``bf16-true`` casts the weights and hooks the inputs.
        """

    def check_setup(self, *, compiled: bool) -> None:
        """Warn about a setup this precision runs badly in (float8 without compilation); nothing here.

        Called by the strategy when it prepares the model, after :meth:`convert_module`.
        """

    @property
    def scales_loss(self) -> bool:
        """Whether a loss scaler is active (float16): the logger then records ``loss_scale``."""
        return self.scaler is not None

    def agrees_with(self, other: Precision) -> bool:
        """Whether ``other`` trains the same way: here, the same autocast dtype.

        The optim builder asks both an optim wrapper's own precision and the Trainer's
        ``precision=``; a precision that casts the weights says no to one that autocasts.
        """
        return other.dtype == self.dtype

    def peak_column(self, param_dtype: torch.dtype | None) -> str:
        """The column of the peak-TFLOP/s table the run's matmuls use (for MFU), given the parameters' dtype."""
        return matmul_column(self.dtype if self.autocasts else None, param_dtype)

    def fsdp_mixed_precision(self) -> dict[str, Any]:
        """Arguments of FSDP2's ``MixedPrecisionPolicy`` (none: parameters and reductions in their own dtype)."""
        return {}

    def deepspeed_config(self) -> dict[str, Any]:
        """The sections this precision adds to a DeepSpeed config where the user's does not set them (none)."""
        return {}

    def without_loss_scaling(self) -> Precision:
        """This precision with its loss scaler disabled (DeepSpeed's engine scales the loss); ``self`` without one."""
        return self

    def sharded(self, device_type: str, scaler_cls: type[torch.amp.GradScaler]) -> Precision:
        """This precision for sharded parameters (FSDP): a float16 scaler becomes a ``scaler_cls`` (the strategy's
        ``ShardedGradScaler``)."""
        return self

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

    def clone(self) -> Precision:
        """A fresh object with the same settings and no state (one per optimizer)."""
        return Precision()

    def state_dict(self) -> dict[str, Any]:
        """Scaler state (empty for full precision)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the scaler state (nothing to restore; a float16 scaler state is ignored with a warning)."""
        _warn_ignored_scaler(state, self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class MixedPrecision(Precision):
    """Autocast mixed precision; float16 adds a GradScaler, bfloat16 does not need one.

    ``float32`` / ``float64`` are accepted as mmengine's ``AmpOptimWrapper`` accepts them:
    ``torch.autocast`` with that dtype where torch supports it (CUDA: matmul/conv-like ops
    run in it), no context where it does not (CPU autocast knows only float16 / bfloat16;
    ``torch.autocast`` would warn and disable itself there, every step). No GradScaler:
    these dtypes do not underflow (mmengine creates one; scaling by a power of two changes
    no value, so the updates are the same, except that mmengine also skips steps with
    non-finite gradients: use ``skip_nonfinite`` for that).

    bfloat16 has float32's exponent range, so gradients do not underflow and no loss
    scaling is needed (:attr:`scaler` is None). float16 gradients do underflow: the loss is
    multiplied by a scale before backward, gradients are divided by it before clipping and
    stepping, and a step whose gradients contain inf/NaN is skipped while the scale backs off.

    Args:
        dtype: ``torch.float16`` / ``"float16"`` or ``torch.bfloat16`` / ``"bfloat16"``.
        device_type: ``"cpu"`` or ``"cuda"`` (the device of the parameters). The scaler is
            created for this device: a bare ``GradScaler()`` means CUDA and silently
            disables itself on CPU.
        loss_scale: float16 only: ``"dynamic"`` (default), a fixed float (steps with inf/NaN
            gradients are still skipped, the scale never changes), or a dict of
            ``torch.amp.GradScaler`` arguments (``init_scale``, ``growth_factor``,
            ``backoff_factor``, ``growth_interval``, ``enabled``).
    """

    def __init__(
        self,
        dtype: torch.dtype | str = torch.bfloat16,
        device_type: str = "cpu",
        loss_scale: str | float | Mapping[str, Any] = "dynamic",
    ) -> None:
        if isinstance(dtype, str):
            if dtype not in _DTYPE_NAMES:
                from trainwright.registry import did_you_mean

                raise ValueError(
                    "Mixed precision dtype must be 'float16', 'bfloat16', 'float32' or 'float64', got "
                    f"{dtype!r}.{did_you_mean(dtype, list(_DTYPE_NAMES))} Use 'float16' (with GradScaler) or "
                    "'bfloat16'"
                )
            dtype = _DTYPE_NAMES[dtype]
        if dtype not in _NAMES:
            raise ValueError(
                "Mixed precision dtype must be torch.float16, torch.bfloat16, torch.float32 or torch.float64, got "
                f"{dtype}; for full precision use Precision() / precision='32'"
            )
        self.dtype = dtype
        self.device_type = str(device_type)
        self.name = _NAMES[dtype]
        self._loss_scale_cfg = dict(loss_scale) if isinstance(loss_scale, Mapping) else loss_scale
        self.scaler = None
        self._static_scale: float | None = None
        # torch.autocast on CUDA takes any float dtype; elsewhere only float16 / bfloat16 (it warns and disables itself
        # otherwise).
        self.autocasts = dtype in (torch.float16, torch.bfloat16) or self.device_type == "cuda"
        if dtype == torch.float64 and not self.autocasts:
            warnings.warn(
                f"dtype=float64 on {self.device_type!r}: torch.autocast supports only float16 / bfloat16 there, so the "
                "forward runs in the model's own "
                "dtype (as under mmengine, whose autocast is disabled the same way). Convert the model with "
                "model.double() to train in float64.",
                UserWarning,
                stacklevel=3,
            )
        if dtype != torch.float16:
            if loss_scale != "dynamic":
                warnings.warn(
                    f"loss_scale={loss_scale!r} is ignored for {_NAMES[dtype]!r} ({dtype}), which needs no loss "
                    "scaling",
                    UserWarning,
                    stacklevel=2,
                )
            return
        if loss_scale == "dynamic":
            kwargs: dict[str, Any] = {}
        elif isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
            if loss_scale <= 0:
                raise ValueError(
                    f"A static loss_scale must be > 0, got {loss_scale}; e.g. loss_scale=512.0, or 'dynamic'"
                )
            self._static_scale = float(loss_scale)
            kwargs = dict(init_scale=self._static_scale)
        elif isinstance(loss_scale, Mapping):
            bad = set(loss_scale) - _SCALER_KEYS
            if bad:
                raise ValueError(
                    f"Unknown loss_scale keys {sorted(bad)}; allowed (torch.amp.GradScaler arguments): "
                    f"{sorted(_SCALER_KEYS)}"
                )
            kwargs = dict(loss_scale)
        else:
            raise ValueError(
                f"loss_scale must be 'dynamic', a number or a dict of GradScaler arguments, got {loss_scale!r}"
            )
        self.scaler = torch.amp.GradScaler(self.device_type, **kwargs)

    plain = False

    def autocast(self) -> contextlib.AbstractContextManager:
        """``torch.autocast`` for the forward pass and loss (no context where torch has no autocast for the dtype)."""
        return torch.autocast(self.device_type, dtype=self.dtype) if self.autocasts else _NULL

    def fsdp_mixed_precision(self) -> dict[str, Any]:
        """Parameters gathered in the autocast dtype, gradients reduced in float32."""
        return {"param_dtype": self.dtype, "reduce_dtype": torch.float32}

    def deepspeed_config(self) -> dict[str, Any]:
        """DeepSpeed's ``bf16`` or ``fp16`` section for those dtypes (nothing for float32 / float64)."""
        if self.dtype is torch.bfloat16:
            return {"bf16": {"enabled": True}}
        if self.dtype is torch.float16:
            return {"fp16": {"enabled": True}}
        return {}

    def without_loss_scaling(self) -> Precision:
        """A float16 precision with the same autocast and a disabled scaler; ``self`` without a scaler."""
        if self.scaler is None:
            return self
        return MixedPrecision(self.dtype, self.device_type, loss_scale={"enabled": False})  # type: ignore[arg-type]

    def sharded(self, device_type: str, scaler_cls: type[torch.amp.GradScaler]) -> Precision:
        """Replace a plain ``GradScaler`` by ``scaler_cls`` with its settings (FSDP's ``ShardedGradScaler``: the ranks
        agree on a skip).

        The strategy names the class: only ``strategies/`` and ``dist/`` import ``torch.distributed``.
        """
        scaler = self.scaler
        if scaler is not None and type(scaler) is torch.amp.GradScaler:
            self.scaler = scaler_cls(
                device_type,
                init_scale=scaler.get_scale() if scaler.is_enabled() else 2.0**16,
                growth_factor=scaler.get_growth_factor(),
                backoff_factor=scaler.get_backoff_factor(),
                growth_interval=scaler.get_growth_interval(),
                enabled=scaler.is_enabled(),
            )
        return self

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
        """Step unless float16 gradients overflowed; then update the loss scale.

        A window in which no parameter received a gradient (every micro-batch skipped for a
        non-finite loss) is a no-op, as a plain ``optimizer.step()`` would be.
        """
        if self.scaler is None:
            optimizer.step(**kwargs)
            return
        if not any(p.grad is not None for group in optimizer.param_groups for p in group["params"]):
            return
        self.scaler.step(optimizer, **kwargs)
        self.scaler.update(self._static_scale)

    @property
    def loss_scale(self) -> torch.Tensor | None:
        """The GradScaler's current scale as a tensor (no host sync); None before the first backward."""
        if self.scaler is None:
            return None
        return self.scaler._scale  # noqa: SLF001 - get_scale() would sync with the device

    def clone(self) -> MixedPrecision:
        """A fresh object with the same dtype, device and loss-scale settings, and a new scaler."""
        return MixedPrecision(self.dtype, self.device_type, self._loss_scale_cfg)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        """The GradScaler state (float16) or nothing (bfloat16)."""
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the GradScaler state (scale, growth tracker, factors)."""
        if self.scaler is None:
            _warn_ignored_scaler(state, self.name)
        elif state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def __repr__(self) -> str:
        scale = "" if self.scaler is None else f", loss_scale={self._loss_scale_cfg!r}"
        return f"{type(self).__name__}({self.name!r}, device_type={self.device_type!r}{scale})"


#: Builds a precision for a device type (``"cpu"``, ``"cuda"``).
PrecisionFactory = Callable[[str], Precision]

_FACTORIES: dict[str, PrecisionFactory] = {}


def register_precision(name: str, factory: PrecisionFactory, *, force: bool = False) -> None:
    """Make ``Trainer(precision=name)`` build its precision with ``factory(device_type)``.

    This is the one place a precision is named: the optim builder, the strategies and the
    hooks ask the object it builds what they need. A new precision is a :class:`Precision`
    subclass plus one call to this function (see ``trainwright.amp.true_precision``).

    Args:
        name: The name given as ``precision=`` (e.g. ``"bf16-true"``).
        factory: Called with the run's device type; returns the precision object.
        force: Replace a name already registered.

    Raises:
        ValueError: ``name`` is registered already and ``force`` is false.
    """
    if name in _FACTORIES and not force:
        raise ValueError(
            f"A precision named {name!r} is registered already; pick another name, or pass force=True to replace it"
        )
    _FACTORIES[name] = factory


def registered_precisions() -> list[str]:
    """Every name ``precision=`` accepts, in registration order."""
    return list(_FACTORIES)


def _autocast_factory(dtype: torch.dtype | None) -> PrecisionFactory:
    if dtype is None:
        return lambda device_type: Precision()
    return lambda device_type: MixedPrecision(dtype, device_type)


for _name, _dtype in PRECISIONS.items():
    register_precision(_name, _autocast_factory(_dtype))


def build_precision(precision: str | Precision | None, device_type: str = "cpu") -> Precision:
    """Build a precision from a registered name (``"32"``, ``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true"``, ...).

    A :class:`Precision` object is returned as is; None means full precision.

    Raises:
        ValueError: The name is not registered (the message lists the registered names).
    """
    if isinstance(precision, Precision):
        return precision
    if precision is None:
        return Precision()
    key = str(precision)
    factory = _FACTORIES.get(key)
    if factory is None:
        from trainwright.registry import did_you_mean

        names = registered_precisions()
        raise ValueError(
            f"Unknown precision {precision!r}.{did_you_mean(key, names)} Use one of {names}, "
            "or register yours with trainwright.amp.register_precision"
        )
    return factory(device_type)
