"""Casting helpers of the mmcv fp16 utilities: ``cast_tensor_type`` and ``patch_forward_method``."""

from __future__ import annotations

import functools
from collections import abc, defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["cast_tensor_type", "patch_forward_method"]


def cast_tensor_type(
    inputs: Any,
    src_type: torch.dtype | torch.device | None,
    dst_type: torch.dtype | torch.device,
) -> Any:
    """Recursively cast the tensors in ``inputs`` from ``src_type`` to ``dst_type``.

    Only tensors that match ``src_type`` are cast, so integer indices, masks and labels
    survive a ``float32 -> float16`` pass untouched (mmcv >= 1.4.4 behaviour).

    Containers are rebuilt with their own type: mappings (``dict``, ``OrderedDict``,
    ``defaultdict`` with its factory, ...), lists, tuples, named tuples and sets. A container
    in which nothing was cast is returned as the same object. ``nn.Module``, ``str``,
    ``bytes``, ``np.ndarray``, iterators and every other object are returned as-is.

    Args:
        inputs: A tensor, or any nesting of containers holding tensors.
        src_type: Which tensors to cast. A ``torch.dtype`` casts tensors of exactly that
            dtype. A ``torch.device`` (only with a device ``dst_type``) moves tensors on
            that device; a device without an index (``cuda``) matches every index. ``None``
            means every floating-point tensor for a dtype ``dst_type`` and every tensor for
            a device ``dst_type``.
        dst_type: The ``torch.dtype`` to cast to, or the ``torch.device`` to move to (as
            mmcv 1.7 allowed).

    Returns:
        ``inputs`` with the matching tensors cast, container types preserved.

    Raises:
        TypeError: If ``dst_type``/``src_type`` are not dtypes/devices and ``inputs`` holds a
            tensor (with nothing to cast they are not used, as in mmcv), or a container type
            cannot be rebuilt from its cast items.

    Example:
        >>> batch = {"img": torch.ones(2, 3), "label": torch.tensor([1, 0])}
        >>> out = cast_tensor_type(batch, torch.float32, torch.float16)
        >>> out["img"].dtype, out["label"].dtype
        (torch.float16, torch.int64)
    """
    error = _type_error(src_type, dst_type)
    if error is not None:
        # mmcv semantics: with nothing to cast the types are never used (cast_tensor_type('x', str, str) == 'x')
        def refuse(t: torch.Tensor) -> bool:
            raise TypeError(error)

        return _cast(inputs, refuse, dst_type)  # type: ignore[arg-type]

    if isinstance(dst_type, torch.device):
        src_dev = src_type if isinstance(src_type, torch.device) else None

        def matches(t: torch.Tensor) -> bool:
            if src_dev is None:
                return True
            if src_dev.index is None:
                return t.device.type == src_dev.type
            return t.device == src_dev

    else:
        src_dtype = src_type

        def matches(t: torch.Tensor) -> bool:
            if src_dtype is None:
                return t.is_floating_point()
            return t.dtype == src_dtype

    return _cast(inputs, matches, dst_type)


def _type_error(src_type: Any, dst_type: Any) -> str | None:
    """Why ``src_type`` / ``dst_type`` cannot cast a tensor, or None when they can."""
    if isinstance(dst_type, torch.device):
        if src_type is not None and not isinstance(src_type, torch.device):
            return (
                f"cast_tensor_type: dst_type is the device {dst_type} but src_type is {src_type!r}; "
                "pass src_type as a torch.device (the device to move from) or None (move every tensor)"
            )
    elif isinstance(dst_type, torch.dtype):
        if src_type is not None and not isinstance(src_type, torch.dtype):
            return (
                f"cast_tensor_type: dst_type is the dtype {dst_type} but src_type is {src_type!r}; "
                "pass src_type as a torch.dtype (e.g. torch.float32) or None (every floating-point tensor)"
            )
    else:
        return (
            f"cast_tensor_type: dst_type must be a torch.dtype or a torch.device, got {dst_type!r} "
            f"({type(dst_type).__name__}); write e.g. torch.float16 or torch.device('cuda')"
        )
    return None


def _cast(obj: Any, matches: Callable[[torch.Tensor], bool], dst: torch.dtype | torch.device) -> Any:
    """Recursive worker of :func:`cast_tensor_type` (arguments already validated)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dst) if matches(obj) else obj
    if isinstance(obj, (nn.Module, str, bytes, bytearray, np.ndarray)):
        return obj
    if isinstance(obj, abc.Mapping):
        items = {k: _cast(v, matches, dst) for k, v in obj.items()}
        if all(items[k] is v for k, v in obj.items()):
            return obj
        return _rebuild(obj, items)
    if isinstance(obj, (abc.Sequence, abc.Set)):
        elems = [_cast(v, matches, dst) for v in obj]
        if all(new is old for new, old in zip(elems, obj)):
            return obj
        return _rebuild(obj, elems)
    return obj


def _rebuild(container: Any, contents: Any) -> Any:
    """Build a container of ``type(container)`` holding ``contents``."""
    cls = type(container)
    try:
        if isinstance(container, defaultdict):
            return cls(container.default_factory, contents)
        if isinstance(container, tuple) and hasattr(cls, "_fields"):  # namedtuple
            return cls(*contents)
        return cls(contents)
    except TypeError as err:
        raise TypeError(
            f"cast_tensor_type cannot rebuild a {cls.__qualname__} from its cast items ({err}); "
            f"give {cls.__qualname__} a constructor that accepts an iterable/dict of its items, "
            "or pass a plain dict/list/tuple instead"
        ) from err


def patch_forward_method(
    func: Callable[..., Any],
    src_type: torch.dtype,
    dst_type: torch.dtype,
    convert_output: bool = True,
) -> Callable[..., Any]:
    """Wrap ``func`` so its inputs are cast ``src_type -> dst_type`` and its outputs back.

    This is how :func:`patch_norm_fp32` makes a norm layer compute in float32 inside a
    half-precision model.

    Args:
        func: The callable to wrap (typically a module's ``forward``).
        src_type: dtype of the tensors to cast on the way in.
        dst_type: dtype ``func`` should see.
        convert_output: Also cast the outputs ``dst_type -> src_type``.

    Returns:
        The wrapping function (``functools.wraps`` keeps ``func``'s name and docstring).

    Example:
        >>> gn = torch.nn.GroupNorm(2, 4)
        >>> fwd = patch_forward_method(gn.forward, torch.float16, torch.float32)
        >>> fwd(torch.randn(2, 4, 3).half()).dtype  # computed in float32
        torch.float16
    """

    @functools.wraps(func)
    def new_forward(*args: Any, **kwargs: Any) -> Any:
        output = func(*cast_tensor_type(args, src_type, dst_type), **cast_tensor_type(kwargs, src_type, dst_type))
        if convert_output:
            output = cast_tensor_type(output, dst_type, src_type)
        return output

    return new_forward
