"""mmcv-compatible fp16 utilities: ``cast_tensor_type``, ``auto_fp16``, ``force_fp32``,
``wrap_fp16_model``, ``patch_norm_fp32`` and ``patch_forward_method``.

They keep models written for mmcv 1.x working after mmcv 2 dropped them, with mmcv's
behaviour for PyTorch >= 1.6 (``torch.autocast``, not half weights); every decorator also
takes a ``dtype``, so the same code runs in bfloat16 on any device with autocast. A module
opts in with ``fp16_enabled = False`` and decorated methods; ``wrap_fp16_model(model)`` flips
the flags to ``True``; while a flag is false the decorators are a plain call.
"""

from __future__ import annotations

import functools
import inspect
from collections import abc
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from trainwright.amp.casting import cast_tensor_type, patch_forward_method

__all__ = [
    "auto_fp16",
    "cast_tensor_type",
    "force_fp32",
    "patch_forward_method",
    "patch_norm_fp32",
    "wrap_fp16_model",
]

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=nn.Module)

_LOW_PRECISION = (torch.float16, torch.bfloat16)
# Marks a GroupNorm already hooked by ``patch_norm_fp32`` so a second call is a no-op
# (a deep copy keeps the mark, with its hooks).
_PATCHED_MARK = "__trainwright_fp32_patched__"


class _InputsToFloat32:
    """Forward pre-hook of :func:`patch_norm_fp32`: the ``dtype`` tensors among the arguments to float32."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return cast_tensor_type(args, self.dtype, torch.float32), cast_tensor_type(kwargs, self.dtype, torch.float32)


class _OutputsBack:
    """Forward hook of :func:`patch_norm_fp32`: the float32 outputs back to ``dtype``."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        return cast_tensor_type(output, torch.float32, self.dtype)


# --------------------------------------------------------------------------- decorators


class _ArgNamer:
    """Maps a call's arguments to the parameter names of the decorated function."""

    def __init__(self, func: Callable[..., Any], apply_to: Iterable[str] | None, decorator: str) -> None:
        params = inspect.signature(func).parameters.values()
        kinds = inspect.Parameter
        self.positional = [p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
        self.var_positional = next((p.name for p in params if p.kind is kinds.VAR_POSITIONAL), None)
        self.var_keyword = next((p.name for p in params if p.kind is kinds.VAR_KEYWORD), None)
        self.named = {p.name for p in params if p.kind is not kinds.VAR_KEYWORD}
        if isinstance(apply_to, str):
            apply_to = (apply_to,)
        self.apply_to = None if apply_to is None else frozenset(apply_to)
        if self.apply_to is not None and self.var_keyword is None:
            unknown = sorted(self.apply_to - self.named)
            if unknown:
                raise ValueError(
                    f"{decorator}(apply_to=...) names {unknown}, which are not arguments of "
                    f"{func.__qualname__}{inspect.signature(func)}; use argument names from that signature"
                )

    def _selected(self, name: str | None) -> bool:
        return self.apply_to is None or (name is not None and name in self.apply_to)

    def cast(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], src: torch.dtype, dst: torch.dtype
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Cast ``src`` tensors among the selected arguments to ``dst`` (``args[0]`` is self)."""
        new_args = [args[0]]
        for i, value in enumerate(args[1:], start=1):
            name = self.positional[i] if i < len(self.positional) else self.var_positional
            new_args.append(cast_tensor_type(value, src, dst) if self._selected(name) else value)
        new_kwargs = {}
        for key, value in kwargs.items():
            selected = self._selected(key) or (key not in self.named and self._selected(self.var_keyword))
            new_kwargs[key] = cast_tensor_type(value, src, dst) if selected else value
        return tuple(new_args), new_kwargs


def _first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor found depth-first in ``obj`` (same traversal as the casting)."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (nn.Module, str, bytes, bytearray, np.ndarray)):
        return None
    if isinstance(obj, abc.Mapping):
        obj = obj.values()
    elif not isinstance(obj, (abc.Sequence, abc.Set)):
        return None
    for item in obj:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


def _device_type(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Device type of the first tensor argument (after self), or ``"cpu"`` if there is none."""
    found = _first_tensor((args[1:], kwargs))
    return found.device.type if found is not None else "cpu"


def _autocast(device_type: str, **kwargs: Any) -> AbstractContextManager[Any]:
    """``torch.autocast`` for ``device_type``, or a no-op where that device has no autocast."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type=device_type, **kwargs)
    return nullcontext()


def _check_dtype(dtype: torch.dtype, where: str) -> None:
    if dtype not in _LOW_PRECISION:
        raise ValueError(f"{where}: dtype must be torch.float16 or torch.bfloat16, got {dtype!r}")


def auto_fp16(
    apply_to: Iterable[str] | None = None,
    out_fp32: bool = False,
    supported_types: tuple[type, ...] = (nn.Module,),
    dtype: torch.dtype = torch.float16,
) -> Callable[[F], F]:
    """Decorator: run a module method in low precision once ``fp16_enabled`` is set.

    When ``self.fp16_enabled`` is truthy, the selected float32 tensor arguments (positional
    or keyword, nested in containers too) are cast to ``dtype`` and the method runs under
    ``torch.autocast(device_type, dtype=dtype)``, ``device_type`` being that of the first
    tensor argument (``"cpu"`` when there is none). When the flag is false or missing, the
    method is called directly, untouched.

    Args:
        apply_to: Names of the arguments to cast; ``None`` casts every argument. Names must
            be parameters of the method (unless it takes ``**kwargs``); the name of a
            ``*args`` / ``**kwargs`` parameter selects everything passed through it.
        out_fp32: Cast the outputs (recursively) from ``dtype`` back to float32.
        supported_types: Classes whose methods may be decorated; ``self`` must be an
            instance of one of them.
        dtype: The low-precision dtype, ``torch.float16`` (mmcv's) or ``torch.bfloat16``.

    Returns:
        The decorator; the decorated method keeps its name, docstring and signature.

    Raises:
        TypeError: At call time, if ``self`` is not an instance of ``supported_types``.
        ValueError: At decoration time, for an unknown ``apply_to`` name or a ``dtype``
            other than float16/bfloat16.

    Example:
        >>> class Head(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = nn.Linear(4, 2)
        ...         self.fp16_enabled = False
        ...     @auto_fp16(apply_to=("x",), dtype=torch.bfloat16)
        ...     def forward(self, x):
        ...         return self.fc(x)
        >>> head = wrap_fp16_model(Head())
        >>> head(torch.randn(3, 4)).dtype
        torch.bfloat16
    """
    _check_dtype(dtype, "auto_fp16")

    def decorator(func: F) -> F:
        namer = _ArgNamer(func, apply_to, "@auto_fp16")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not args or not isinstance(args[0], supported_types):
                got = type(args[0]).__qualname__ if args else "no positional argument"
                raise TypeError(
                    f"@auto_fp16 can only be used to decorate the method of those classes {supported_types}, "
                    f"but {func.__qualname__} was called on {got}; decorate a method of one of those classes "
                    "or add the class to supported_types"
                )
            if not getattr(args[0], "fp16_enabled", False):
                return func(*args, **kwargs)
            new_args, new_kwargs = namer.cast(args, kwargs, torch.float32, dtype)
            with _autocast(_device_type(new_args, new_kwargs), dtype=dtype):
                output = func(*new_args, **new_kwargs)
            if out_fp32:
                output = cast_tensor_type(output, dtype, torch.float32)
            return output

        return wrapper  # type: ignore[return-value]

    return decorator


def force_fp32(
    apply_to: Iterable[str] | None = None,
    out_fp16: bool = False,
    dtype: torch.dtype = torch.float16,
) -> Callable[[F], F]:
    """Decorator: run a module method in float32 even inside a low-precision region.

    The reverse of :func:`auto_fp16`, for the parts that must not run in half precision
    (losses, box decoding, softmax over large logits). When ``self.fp16_enabled`` is truthy,
    the selected ``dtype`` tensor arguments are cast to float32 and the method runs with
    autocast disabled for the device of the first tensor argument, so ops inside really
    compute in float32. When the flag is false or missing, the method is called directly.

    Args:
        apply_to: Names of the arguments to cast; ``None`` casts every argument (same rules
            as :func:`auto_fp16`).
        out_fp16: Cast the outputs (recursively) from float32 to ``dtype``.
        dtype: The low-precision dtype the arguments arrive in, ``torch.float16`` (mmcv's)
            or ``torch.bfloat16``.

    Returns:
        The decorator; the decorated method keeps its name, docstring and signature.

    Raises:
        TypeError: At call time, if ``self`` is not an ``nn.Module``.
        ValueError: At decoration time, for an unknown ``apply_to`` name or a ``dtype``
            other than float16/bfloat16.

    Example:
        >>> class Loss(nn.Module):
        ...     fp16_enabled = True
        ...     @force_fp32(apply_to=("logits",))
        ...     def forward(self, logits, target):
        ...         return nn.functional.cross_entropy(logits, target)
        >>> Loss()(torch.randn(3, 5).half(), torch.tensor([0, 1, 2])).dtype
        torch.float32
    """
    _check_dtype(dtype, "force_fp32")

    def decorator(func: F) -> F:
        namer = _ArgNamer(func, apply_to, "@force_fp32")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not args or not isinstance(args[0], nn.Module):
                got = type(args[0]).__qualname__ if args else "no positional argument"
                raise TypeError(
                    f"@force_fp32 can only be used to decorate the method of nn.Module, but "
                    f"{func.__qualname__} was called on {got}; decorate a method of an nn.Module subclass"
                )
            if not getattr(args[0], "fp16_enabled", False):
                return func(*args, **kwargs)
            new_args, new_kwargs = namer.cast(args, kwargs, dtype, torch.float32)
            with _autocast(_device_type(new_args, new_kwargs), enabled=False):
                output = func(*new_args, **new_kwargs)
            if out_fp16:
                output = cast_tensor_type(output, torch.float32, dtype)
            return output

        return wrapper  # type: ignore[return-value]

    return decorator


# --------------------------------------------------------------------------- model helpers


def wrap_fp16_model(model: M, dtype: torch.dtype = torch.float16) -> M:
    """Switch a model to mixed precision: set ``fp16_enabled = True`` on every submodule
    (``model`` included) that has an ``fp16_enabled`` attribute.

    This is mmcv 1.x's behaviour for PyTorch >= 1.6: the weights stay float32 and the
    ``@auto_fp16`` / ``@force_fp32`` methods switch to autocast. (mmcv on PyTorch < 1.6 also
    called ``model.half()`` and :func:`patch_norm_fp32`; that path is not reproduced. Call
    both yourself if you really want half weights.) Loss scaling is the optimizer wrapper's
    job, not this function's.

    Args:
        model: The model to switch.
        dtype: The low-precision dtype the model's decorators were written for; only
            validated here (float16 or bfloat16), the decorators' own ``dtype`` decides.

    Returns:
        ``model`` itself, for chaining.

    Example:
        >>> class Net(nn.Module):
        ...     fp16_enabled = False
        >>> wrap_fp16_model(nn.Sequential(Net(), nn.ReLU()))[0].fp16_enabled
        True
    """
    _check_dtype(dtype, "wrap_fp16_model")
    for module in model.modules():
        if hasattr(module, "fp16_enabled"):
            setattr(module, "fp16_enabled", True)  # noqa: B010 - an attribute nn.Module does not declare
    return model


def patch_norm_fp32(module: M, dtype: torch.dtype = torch.float16) -> M:
    """Keep normalisation layers in float32 inside a half-precision model.

    Recursively, every ``_BatchNorm`` (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``) and
    ``GroupNorm`` gets its parameters and buffers converted back with ``.float()``.
    ``GroupNorm`` also gets forward hooks (torch's ``register_forward_pre_hook`` /
    ``register_forward_hook``; mmcv replaced its ``forward``) that cast ``dtype`` inputs to
    float32 and its outputs back to ``dtype``; batch norm accepts mixed input/parameter
    dtypes natively. The hooks run when the layer is called (``gn(x)``), not on a direct
    ``gn.forward(x)``. Patching twice is harmless, a ``deepcopy`` of the model (e.g. for
    EMA) carries the hooks to the copy's own layer, and the model stays picklable.

    Args:
        module: The model, usually after ``model.half()``.
        dtype: The model's low-precision dtype (mmcv: always ``torch.float16``).

    Returns:
        ``module`` itself.

    Example:
        >>> model = patch_norm_fp32(nn.Sequential(nn.Conv1d(4, 4, 1), nn.GroupNorm(2, 4)).half())
        >>> model[0].weight.dtype, model[1].weight.dtype
        (torch.float16, torch.float32)
    """
    if isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm)):
        module.float()
        if isinstance(module, nn.GroupNorm) and not getattr(module, _PATCHED_MARK, False):
            module.register_forward_pre_hook(_InputsToFloat32(dtype), with_kwargs=True)
            module.register_forward_hook(_OutputsBack(dtype))
            setattr(module, _PATCHED_MARK, True)  # noqa: B010 - an attribute nn.Module does not declare
    for child in module.children():
        patch_norm_fp32(child, dtype)
    return module
