"""Names of a package that load on first use (PEP 562), so that a run keeps only the code it uses.

A package lists those names once, as imports under ``if TYPE_CHECKING:`` in its ``__init__.py`` (type checkers and
IDEs read them there), and ends with ``__getattr__, __dir__ = lazy_names(__name__, __file__, globals())``: the first
read of such a name imports its module (as scientific-python's ``lazy_loader.attach_stub`` does from a stub file).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from typing import Any


def type_checking_imports(source: str) -> dict[str, str]:
    """``name -> "module"`` (or ``"module:attr"`` for ``import attr as name``) of the ``from module import ...``
    statements under the top-level ``if TYPE_CHECKING:`` blocks of ``source``."""
    names: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                    for alias in stmt.names:
                        where = stmt.module if alias.asname in (None, alias.name) else f"{stmt.module}:{alias.name}"
                        names[alias.asname or alias.name] = where
    return names


def lazy_names(
    package: str, init_file: str | None, namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: a name imported under ``if TYPE_CHECKING:`` in its
    ``init_file`` (its ``__init__.py``) is imported from its module the first time it is read, then kept in the
    package's ``namespace`` (its ``globals()``); any other missing name is an ``AttributeError``."""
    table: dict[str, str] | None = None

    def lazy() -> dict[str, str]:
        nonlocal table
        if table is None:
            if init_file is None:
                table = {}
            else:
                with open(init_file, encoding="utf-8") as f:
                    table = type_checking_imports(f.read())
        return table

    def __getattr__(name: str) -> Any:
        where = lazy().get(name) if not name.startswith("__") else None
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where.partition(":")
        value = getattr(importlib.import_module(module), attr or name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *lazy()})

    return __getattr__, __dir__
