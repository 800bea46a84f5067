"""Compiling the model: whole (``compile=True`` or ``torch.compile`` arguments)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn


def apply_compile(model: nn.Module, compile: bool | Mapping[str, Any]) -> None:
    """Compile ``model`` in place (``nn.Module.compile``) when ``compile`` asks for it."""
    if compile:
        model.compile(**(dict(compile) if isinstance(compile, Mapping) else {}))
