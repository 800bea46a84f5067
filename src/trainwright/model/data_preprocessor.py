"""Data preprocessors: move a batch to the model's device (and normalise, if asked)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from typing_extensions import Self

from trainwright.registry import MODELS


def cast_data(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Recursively move every tensor in ``data`` (mappings, lists, tuples, namedtuples) to ``device``."""
    if isinstance(data, torch.Tensor):
        if device.type == "cpu" and data.is_cpu:
            return data
        return data if data.device == device else data.to(device, non_blocking=non_blocking)
    if type(data) is list or type(data) is tuple:  # fast path for the common (x, y) batch
        return type(data)([cast_data(v, device, non_blocking) for v in data])
    if isinstance(data, Mapping):
        moved = {k: cast_data(v, device, non_blocking) for k, v in data.items()}
        return moved if type(data) is dict else type(data)(moved)  # type: ignore[call-arg]  # a Mapping subclass rebuilt from a dict
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(cast_data(v, device, non_blocking) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(cast_data(v, device, non_blocking) for v in data)
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return [cast_data(v, device, non_blocking) for v in data]
    return data


class FollowsDevice(nn.Module):
    """A module whose ``.to()`` / ``.cuda()`` / ``.cpu()`` also tell every :class:`BaseDataPreprocessor` in it where
    batches now go."""

    def to(self, *args: Any, **kwargs: Any) -> Self:  # type: ignore[override]
        """Move the module (as ``nn.Module.to``) and send batches to the new device."""
        out = super().to(*args, **kwargs)
        device = torch._C._nn._parse_to(*args, **kwargs)[0]  # noqa: SLF001 - torch's own argument parser
        if device is not None:
            set_preprocessor_device(self, device)
        return out

    def cuda(self, device: int | torch.device | None = None) -> Self:  # type: ignore[override]
        """Move to a GPU (the current one by default), as :meth:`to` does."""
        return self.to(cuda_device(device))

    def cpu(self) -> Self:  # type: ignore[override]
        """Move to the CPU, as :meth:`to` does."""
        return self.to("cpu")


def cuda_device(device: int | torch.device | None) -> torch.device:
    """What ``Module.cuda(device)`` moves to: the current GPU by default, else that index or device."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device) if isinstance(device, torch.device) else torch.device("cuda", device)


def set_preprocessor_device(module: nn.Module, device: torch.device | str) -> None:
    """Tell every :class:`BaseDataPreprocessor` in ``module`` (itself included) that batches now go to ``device``."""
    for m in module.modules():
        if isinstance(m, BaseDataPreprocessor):
            m.device = torch.device(device)


@MODELS.register_module()
class BaseDataPreprocessor(FollowsDevice):
    """Moves a batch to :attr:`device`; subclasses normalise or augment on the device.

    Args:
        non_blocking: Use non-blocking host→device copies (pinned memory on CUDA).
    """

    def __init__(self, non_blocking: bool = False) -> None:
        super().__init__()
        self.non_blocking = non_blocking
        self.device = torch.device("cpu")

    @property
    def device(self) -> torch.device:
        """Where batches are moved (set by ``BaseModel.to`` and the strategy)."""
        return self._device

    @device.setter
    def device(self, value: torch.device | str) -> None:
        self._device = torch.device(value)

    def cast_data(self, data: Any) -> Any:
        """``data`` with every tensor on :attr:`device` (mmengine's method; subclasses' ``forward`` start with it)."""
        return cast_data(data, self.device, self.non_blocking)

    def forward(self, data: Any, training: bool = False) -> Any:
        """Return ``data`` on the model's device."""
        return cast_data(data, self.device, self.non_blocking)


@MODELS.register_module()
class NormalizingDataPreprocessor(BaseDataPreprocessor):
    """Moves the batch and normalises its first element: ``(x - mean) / std``.

    Args:
        mean: Per-channel (or scalar) mean.
        std: Per-channel (or scalar) standard deviation.
        channel_dim: Dimension of the input that holds channels (1 for NCHW).
    """

    def __init__(
        self,
        mean: Sequence[float] | float,
        std: Sequence[float] | float,
        channel_dim: int = 1,
        non_blocking: bool = False,
    ) -> None:
        super().__init__(non_blocking)
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32), persistent=False)
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32), persistent=False)
        self.channel_dim = channel_dim

    def forward(self, data: Any, training: bool = False) -> Any:
        """Move and normalise the inputs (first element of a tuple batch / ``"inputs"`` of a dict)."""
        data = super().forward(data, training)
        key = "inputs" if isinstance(data, Mapping) else 0
        x = data[key]
        shape = [1] * x.dim()
        if self.mean.dim():
            shape[self.channel_dim] = -1
        x = (x - self.mean.view(shape)) / self.std.view(shape)
        if isinstance(data, Mapping):
            return {**data, key: x}
        return type(data)((x, *data[1:])) if isinstance(data, (list, tuple)) else x
