"""Running the code a config names: a ``.py`` config file as a module, and ``custom_imports``.

Used by ``Config`` (loading a file) and ``Trainer.from_config`` (a config given as a dict):
one way to import the modules and files that register components.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import traceback
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainwright.registry import ConfigError


def run_code(code: types.CodeType, path: Path) -> types.ModuleType:
    """Run compiled ``.py`` config code as a module named after the file's path (classes defined there pickle and
    register by it)."""
    name = "trainwright_config_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)  # noqa: S102 - a config file is code the user asked to run
    except Exception as e:
        lineno = next(
            (f.lineno for f in reversed(traceback.extract_tb(e.__traceback__)) if f.filename == str(path)), None
        )
        where = f"{path}:{lineno}" if lineno is not None else str(path)
        raise ConfigError(f"{where}: running the config failed: {type(e).__name__}: {e}") from e
    return module


def import_list(custom_imports: Any) -> list[str]:
    """The entries of a ``custom_imports`` value (a dict with ``imports``, a list, or one name)."""
    imports = custom_imports.get("imports", []) if isinstance(custom_imports, Mapping) else custom_imports or []
    return [imports] if isinstance(imports, str) else list(imports)


def import_modules(custom_imports: Any, path: Path | None = None) -> None:
    """Import the modules of ``custom_imports = dict(imports=[...], allow_failed_imports=False)``.

    An entry ending in ``.py`` is a file (relative to the config's folder) run as a config file
    is run, for the classes it registers. The config file's folder and the current folder are
    searched too, so a module next to the config is found however trainwright was started.
    """
    if not custom_imports:
        return
    imports = import_list(custom_imports)
    allow_failed = isinstance(custom_imports, Mapping) and bool(custom_imports.get("allow_failed_imports", False))
    extra = [
        str(p) for p in ([path.resolve().parent] if path is not None else []) + [Path.cwd()] if str(p) not in sys.path
    ]
    sys.path.extend(extra)
    try:
        for mod in imports:
            if str(mod).endswith(
                ".py"
            ):  # a config file that defines components (what a dump names): run it as the loader does
                file = Path(mod) if Path(mod).is_absolute() or path is None else path.resolve().parent / mod
                if not file.is_file():
                    if allow_failed:
                        continue
                    raise ConfigError(
                        f"custom_imports: no file {str(file)!r}; the config that defines these components was moved or "
                        "deleted: restore it, or edit custom_imports"
                    )
                text = file.read_text(encoding="utf-8")
                run_code(compile(text, str(file), "exec"), file)
                continue
            try:
                importlib.import_module(mod)
            except ImportError as e:
                if allow_failed:
                    continue
                raise ConfigError(
                    f"custom_imports: cannot import {mod!r} ({e}); make it importable (install it, or add its folder "
                    "to PYTHONPATH), "
                    "or set custom_imports=dict(imports=[...], allow_failed_imports=True)"
                ) from e
    finally:
        for p in extra:
            if p in sys.path:
                sys.path.remove(p)


__all__ = ["import_list", "import_modules", "run_code"]
