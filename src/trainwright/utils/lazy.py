"""Names of a package that load on first use (PEP 562), so that a run keeps only the code it uses."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, names: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose ``names`` (``name -> "module"`` or ``"module:attr"``)
    are imported the first time they are read, then kept in its ``namespace`` (its ``globals()``).

    Usage, at the end of a package's ``__init__``, with the same names imported under ``TYPE_CHECKING`` so that type
    checkers and IDEs see them::

        __getattr__, __dir__ = lazy_names(__name__, {"EMAHook": "trainwright.hooks.ema"}, globals())
    """

    def __getattr__(name: str) -> Any:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where.partition(":")
        value = getattr(importlib.import_module(module), attr or name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
