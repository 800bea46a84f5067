"""``Config``: a config file (``.py``, ``.yaml`` / ``.yml``, ``.json``) as a dict with attribute access.

The format follows OpenMMLab mmengine: a ``.py`` config is its module-level variables
(names starting with ``_`` and modules, functions and classes are left out); ``_base_``
names the file(s) it inherits from; a dict holding ``_delete_=True`` replaces the inherited
dict instead of being merged into it; ``custom_imports = dict(imports=[...])`` imports modules
(or runs ``.py`` files) that register components. A dump of a config whose files define classes
names those files in ``custom_imports``, so it builds the same components.
"""

from __future__ import annotations
import __future__

import ast
import copy
import json
import pprint
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainwright.config.overrides import apply_overrides, parse_overrides
from trainwright.config.substitute import resolve_base_refs, substitute_text
from trainwright.registry import ConfigError, did_you_mean
from trainwright.utils.imports import import_list, import_modules, run_code

BASE_KEY = "_base_"
DELETE_KEY = "_delete_"
SUFFIXES = (".py", ".yaml", ".yml", ".json")


class ConfigDict(dict):  # type: ignore[type-arg]
    """A ``dict`` whose keys are also attributes (``cfg.model.type``); nested dicts become ConfigDicts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, _wrap(value))

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no key {name!r}.{did_you_mean(name, [str(k) for k in self])}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """``dict.update`` that wraps nested dicts."""
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """``dict.setdefault`` that wraps nested dicts."""
        if key not in self:
            self[key] = default
        return self[key]

    def copy(self) -> ConfigDict:
        """A deep copy (nested dicts are not shared)."""
        return copy.deepcopy(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> ConfigDict:
        out = type(self).__new__(type(self))
        dict.__init__(out)
        memo[id(self)] = out
        for k, v in self.items():
            dict.__setitem__(out, k, copy.deepcopy(v, memo))
        out.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return out

    def __reduce__(self) -> Any:
        return (type(self), (), dict(self.__dict__), None, iter(self.items()))

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested ``dict`` / ``list`` / ``tuple`` values, no ConfigDicts."""
        return _unwrap(self)  # type: ignore[no-any-return]


def _wrap(value: Any) -> Any:
    if isinstance(value, ConfigDict):
        return value
    if isinstance(value, Mapping):
        return ConfigDict(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(_wrap(v) for v in value)
    return value


def _unwrap(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(_unwrap(v) for v in value)
    return value


class Config(ConfigDict):
    """A loaded config: the merged keys of a file and its ``_base_`` files, plus where it came from.

    Build one with :meth:`fromfile` (or ``Config(dict(...))``), change it with
    :meth:`merge_from_dict` / ``cfg.key = value``, build a trainer with
    ``Trainer.from_config(cfg)``, write it with :meth:`dump`.
    """

    def __init__(self, cfg: Mapping[str, Any] | None = None, filename: str | Path | None = None) -> None:
        super().__init__(cfg or {})
        object.__setattr__(self, "filename", str(filename) if filename is not None else None)

    filename: str | None

    @classmethod
    def fromfile(cls, path: str | Path, import_custom_modules: bool = True) -> Config:
        """Load ``path`` (``.py``, ``.yaml``, ``.yml`` or ``.json``) with its ``_base_`` files merged in.

        Raises:
            ConfigError: the file is missing or has an unknown suffix, a syntax error (the
                message gives file and line), a ``_base_`` cycle, or a ``custom_imports``
                module cannot be imported.
        """
        path = Path(path)
        sources: list[tuple[Path, str]] = []
        data = _load_with_bases(path, chain=(), sources=sources)
        if import_custom_modules:
            import_modules(data.get("custom_imports"), path)
        cfg = cls(data, filename=path)
        object.__setattr__(cfg, "_text", "\n".join(f"{p}\n{raw}" for p, raw in sources))
        object.__setattr__(
            cfg, "_code_files", [str(p.resolve()) for p, raw in sources if p.suffix == ".py" and _defines_code(raw)]
        )
        return cfg

    @classmethod
    def fromstring(cls, text: str, suffix: str) -> Config:
        """Parse ``text`` as a ``.py`` / ``.yaml`` / ``.json`` config (no ``_base_`` files).

        Raises:
            ConfigError: ``suffix`` is not one of those formats.
        """
        if suffix not in SUFFIXES:
            raise ConfigError(
                f"Config.fromstring: unknown config format {suffix!r}; use one of {', '.join(SUFFIXES)} (with the dot)"
            )
        data = _parse_text(text, suffix, Path(f"<string>{suffix}"))
        data.pop(BASE_KEY, None)
        return cls(_strip_delete(data))

    def merge_from_dict(self, options: Mapping[str, Any], allow_list_keys: bool = True) -> None:
        """Apply dotted overrides: ``{"optim_wrapper.optimizer.lr": 0.01, "model.layers.0.width": 8}``.

        Keys that do not exist yet are created; an integer part indexes into a list
        (``allow_list_keys=False`` refuses that, as mmengine's does).
        """
        apply_overrides(self, options, allow_list_keys=allow_list_keys)

    @property
    def text(self) -> str:
        """The text of the file and its ``_base_`` files (bases first, each after its path), as loaded; ``""`` for a
        config not read from a file."""
        return str(self.__dict__.get("_text", ""))

    @staticmethod
    def diff(cfg1: Mapping[str, Any], cfg2: Mapping[str, Any]) -> str:
        """A unified diff of the two configs' :attr:`pretty_text` (mmengine's ``Config.diff``); ``""`` when equal."""
        import difflib

        a, b = (c.pretty_text if isinstance(c, Config) else Config(c).pretty_text for c in (cfg1, cfg2))
        return "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True), "cfg1", "cfg2"))

    def merge_from_args(self, options: Iterable[str]) -> None:
        """Apply ``KEY=VALUE`` strings as the command line gives them (``--cfg-options``)."""
        apply_overrides(self, parse_overrides(options))

    @property
    def pretty_text(self) -> str:
        """The config as the text of a ``.py`` file (``key = value`` per line)."""
        return "".join(f"{k} = {pprint.pformat(_literal(v), width=120, sort_dicts=False)}\n" for k, v in self.items())

    def dump(self, path: str | Path) -> Path:
        """Write the resolved config to ``path``; its suffix (``.py``, ``.yaml``, ``.json``) picks the format.

        Values that are not plain data (a class given as ``type=``, a Dataset object) are
        written as strings (``"module.Class"`` / their repr): the dump records what ran.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _literal(self)
        given = data.get("custom_imports")
        code = [f for f in self.__dict__.get("_code_files", ()) if f not in import_list(given)]
        # the classes / functions its files define: the dump runs those files (custom_imports), so it builds as the
        # original did
        if code:
            data["custom_imports"] = {
                **(given if isinstance(given, Mapping) else {}),
                "imports": [*import_list(given), *code],
            }
        if path.suffix == ".py":
            text = Config(data).pretty_text
        elif path.suffix in (".yaml", ".yml"):
            yaml = _require_yaml(path)
            text = yaml.safe_dump(_jsonable(data), sort_keys=False, default_flow_style=None)
        elif path.suffix == ".json":
            text = json.dumps(_jsonable(data), indent=2) + "\n"
        else:
            raise ConfigError(
                f"Cannot dump a config to {str(path)!r}: unknown suffix {path.suffix!r}; use one of {SUFFIXES}"
            )
        path.write_text(text, encoding="utf-8")
        return path

    def __repr__(self) -> str:
        return f"Config(filename={self.filename!r}):\n{self.pretty_text}"


# -- loading ---------------------------------------------------------------------------------
def _load_with_bases(
    path: Path, chain: tuple[Path, ...], sources: list[tuple[Path, str]] | None = None
) -> dict[str, Any]:
    """The file's keys merged over its ``_base_`` files' (each resolved relative to ``path``); ``sources`` collects
    each file and its text, bases first."""
    if not path.is_file():
        hint = " (a folder: name a config file inside it)" if path.is_dir() else ""
        raise ConfigError(
            f"Config file not found: {str(path)!r}{hint}; check the path (relative paths start at {str(Path.cwd())!r})"
        )
    if path.suffix not in SUFFIXES:
        raise ConfigError(f"Unknown config format {path.suffix!r} for {str(path)!r}; use one of {', '.join(SUFFIXES)}")
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in (*chain, resolved))
        raise ConfigError(f"_base_ cycle: {cycle}; a config cannot inherit from itself")
    raw = path.read_text(encoding="utf-8")
    text, refs = substitute_text(raw, path)
    data = _parse_text(text, path.suffix, path)
    bases = data.pop(BASE_KEY, None)
    if bases is None:
        if refs:
            raise ConfigError(
                f"{path}: {{{{_base_.{next(iter(refs.values()))}}}}} needs a _base_ file to refer to; add _base_ = "
                "[...]"
            )
        if sources is not None:
            sources.append((path, raw))
        return _strip_delete(data)
    if isinstance(bases, (str, Path)):
        bases = [bases]
    if not isinstance(bases, (list, tuple)) or not all(isinstance(b, (str, Path)) for b in bases):
        raise ConfigError(f"{path}: _base_ must be a file name or a list of file names, got {bases!r}")
    merged: dict[str, Any] = {}
    for base in bases:
        base_data = _load_with_bases(path.parent / base, (*chain, resolved), sources)
        clash = set(merged) & set(base_data)
        if clash:
            raise ConfigError(
                f"{path}: keys {sorted(clash)} are set by more than one _base_ file; set each in one base, or override "
                f"it in {path.name}"
            )
        merged.update(base_data)
    if sources is not None:
        sources.append((path, raw))
    return merge(merged, resolve_base_refs(data, refs, merged, path))


def merge(base: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """``child`` merged into ``base``: nested dicts merge key by key; other values (lists too) replace.

    A dict of ``child`` holding ``_delete_=True`` replaces the dict of ``base`` instead.
    """
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, Mapping) and not value.get(DELETE_KEY, False) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = _strip_delete(value)
    return out


def _strip_delete(value: Any) -> Any:
    """``value`` without ``_delete_`` keys (they only matter while merging)."""
    if isinstance(value, Mapping):
        return {k: _strip_delete(v) for k, v in value.items() if k != DELETE_KEY}
    if isinstance(value, list):
        return [_strip_delete(v) for v in value]
    return value


def _parse_text(text: str, suffix: str, path: Path) -> dict[str, Any]:
    if suffix == ".py":
        return _parse_py(text, path)
    if suffix in (".yaml", ".yml"):
        yaml = _require_yaml(path)
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            raise ConfigError(f"{where}: invalid YAML: {getattr(e, 'problem', None) or e}") from e
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a config file must hold a mapping of keys to values at the top level, got {type(data).__name__}"
        )
    return data


def _parse_py(text: str, path: Path) -> dict[str, Any]:
    """Run a ``.py`` config as a module; return its public module-level variables."""
    try:
        code = compile(text, str(path), "exec")
    except SyntaxError as e:
        line = f"\n    {e.text.rstrip()}" if e.text else ""
        raise ConfigError(f"{path}:{e.lineno}: syntax error: {e.msg}{line}") from e
    module = run_code(code, path)
    imported = _imported_names(ast.parse(text))
    return {
        k: v
        for k, v in module.__dict__.items()
        if (not k.startswith("_") or k == BASE_KEY)
        and k not in imported
        and not isinstance(v, (types.ModuleType, types.FunctionType, type, __future__._Feature))
    }


def _defines_code(text: str) -> bool:
    """Whether a ``.py`` config defines classes or functions at module level (a dump leaves them out, so it names the
    file to run)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    return any(isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) for n in tree.body)


def _imported_names(node: ast.AST) -> set[str]:
    """Names bound by ``import`` statements at module level (not inside functions or classes): not config keys."""
    names: set[str] = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in child.names)
        elif not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            names |= _imported_names(child)
    return names


def _require_yaml(path: Path) -> Any:
    try:
        import yaml  # type: ignore[import-untyped,unused-ignore]
    except ImportError as e:
        raise ConfigError(f"{path}: YAML configs need PyYAML: pip install 'trainwright[yaml]' (or pyyaml)") from e
    return yaml


# -- dumping ---------------------------------------------------------------------------------
def _literal(value: Any) -> Any:
    """``value`` as Python literals: nested dicts / lists / tuples of str, numbers, bool, None; other objects as
    strings."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_literal(v) for v in value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
