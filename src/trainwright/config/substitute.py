"""mmengine's text substitutions in config files, applied before a file is parsed.

``{{ fileDirname }}`` / ``{{ fileBasename }}`` / ``{{ fileBasenameNoExtension }}`` /
``{{ fileExtname }}`` (the file's own path), ``{{$NAME:default}}`` (an environment variable),
and ``{{_base_.key}}`` (a value of the merged ``_base_`` files, any type, resolved after they
are loaded).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainwright.registry import ConfigError

_PREDEFINED = re.compile(r"\{\{\s*(fileDirname|fileBasename|fileBasenameNoExtension|fileExtname)\s*\}\}")
_ENV = re.compile(r"\{\{['\"]?\s*\$(\w+)\s*:\s*(.*?)\s*['\"]?\}\}")
_BASE_REF = re.compile(r"\{\{\s*_base_\.([\w\.]+)\s*\}\}")


def substitute_text(text: str, path: Path) -> tuple[str, dict[str, str]]:
    """``text`` with the predefined and environment variables filled in and each ``{{_base_.key}}`` a placeholder.

    Returns:
        The text, and ``{placeholder: dotted base key}`` for :func:`resolve_base_refs`.
    """
    values = {
        "fileDirname": str(path.parent),
        "fileBasename": path.name,
        "fileBasenameNoExtension": path.stem,
        "fileExtname": path.suffix,
    }
    text = _PREDEFINED.sub(lambda m: values[m[1]].replace("\\", "/"), text)
    text = _ENV.sub(lambda m: os.environ.get(m[1], m[2]), text)
    refs: dict[str, str] = {}
    for key in sorted(set(_BASE_REF.findall(text))):
        placeholder = f"_tw_base_{key.replace('.', '_')}_{uuid.uuid4().hex[:8]}"
        refs[placeholder] = key
        text = re.sub(r"\{\{\s*_base_\." + re.escape(key) + r"\s*\}\}", f'"{placeholder}"', text)
    return text, refs


def resolve_base_refs(value: Any, refs: Mapping[str, str], base: Mapping[str, Any], path: Path) -> Any:
    """``value`` with every placeholder string of :func:`substitute_text` replaced by the base's value at its key."""
    if not refs:
        return value
    if isinstance(value, str) and value in refs:
        return _lookup(base, refs[value], path)
    if isinstance(value, Mapping):
        return {k: resolve_base_refs(v, refs, base, path) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_base_refs(v, refs, base, path) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve_base_refs(v, refs, base, path) for v in value)
    return value


def _lookup(base: Mapping[str, Any], key: str, path: Path) -> Any:
    node: Any = base
    for i, part in enumerate(key.split(".")):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            where = ".".join(key.split(".")[:i]) or "the _base_ files"
            raise ConfigError(
                f"{path}: {{{{_base_.{key}}}}} refers to {part!r}, which {where} does not have; name a key the _base_ "
                "files set"
            )
    return node
