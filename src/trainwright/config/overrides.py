"""Dotted ``key=value`` overrides (``--cfg-options optim_wrapper.optimizer.lr=0.01 model.depths=[2,2]``)."""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from trainwright.registry import ConfigError

_WORDS = {"true": True, "false": False, "none": None, "null": None}


def parse_value(text: str) -> Any:
    """A command-line value as Python data.

    Python literals (``1``, ``0.5``, ``1e-3``, ``'x'``, ``[1, 2]``, ``(1, 2)``, ``dict(...)`` is not
    one), ``true`` / ``false`` / ``none`` / ``null`` in any case, and comma lists without
    brackets (``1,2,3`` -> ``[1, 2, 3]``); anything else stays a string.
    """
    text = text.strip()
    if text.lower() in _WORDS:
        return _WORDS[text.lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    _check_brackets(text)
    if text[:1] in "[(" and text[-1:] in "])":  # a bracketed list of bare words: [a,b]
        items = [parse_value(t) for t in _split_top(text[1:-1])] if text[1:-1].strip() else []
        return items if text[0] == "[" else tuple(items)
    if "," in text:
        return [parse_value(t) for t in _split_top(text)]
    return text


def _check_brackets(text: str) -> None:
    """Raise a ConfigError naming ``text`` when its brackets do not pair up (``[1,2``, ``(a]``)."""
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            stack.append(ch)
            break
    if stack:
        raise ConfigError(
            f"the value {text!r} has unbalanced brackets; close each '[', '(' and '{{' (quote the whole option in the "
            "shell, e.g. 'a=[1,2]')"
        )


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_overrides(options: Iterable[str]) -> dict[str, Any]:
    """``["a.b=1", "c=[1,2]"]`` -> ``{"a.b": 1, "c": [1, 2]}``.

    Raises:
        ConfigError: an option without ``=`` or with an empty key.
    """
    out: dict[str, Any] = {}
    for opt in options:
        key, sep, value = opt.partition("=")
        if not sep:
            raise ConfigError(
                f"--cfg-options {opt!r} has no value: write KEY=VALUE, e.g. {opt}=1 (quote values with spaces)"
            )
        if not key.strip() or any(not part for part in key.strip().split(".")):
            raise ConfigError(
                f"--cfg-options {opt!r}: the key is empty or has an empty part; write dotted keys like "
                "optim_wrapper.optimizer.lr=0.01"
            )
        out[key.strip()] = parse_value(value)
    return out


def apply_overrides(cfg: MutableMapping[str, Any], options: Mapping[str, Any], allow_list_keys: bool = True) -> None:
    """Set each dotted key of ``options`` in ``cfg``; missing dicts on the way are created, integer parts index lists
    (unless not ``allow_list_keys``)."""
    for dotted, value in options.items():
        parts = dotted.split(".")
        node: Any = cfg
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not allow_list_keys:
                    raise ConfigError(
                        f"override {dotted!r}: {'.'.join(parts[:i]) or 'the config'} is a list; indexing it needs "
                        "allow_list_keys=True"
                    )
                if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
                    raise ConfigError(
                        f"override {dotted!r}: {'.'.join(parts[:i]) or 'the config'} is a list of {len(node)} items; "
                        f"{part!r} is not an index of it"
                    )
                if last:
                    node[int(part)] = value
                else:
                    node = node[int(part)]
            elif isinstance(node, MutableMapping):
                if last:
                    node[part] = value
                else:
                    if node.get(part) is None:
                        node[part] = {}
                    node = node[part]
            else:
                raise ConfigError(
                    f"override {dotted!r}: {'.'.join(parts[:i])} is a {type(node).__name__} ({node!r}), not a dict or "
                    f"list; set {'.'.join(parts[:i])} itself"
                )


class DictAction(argparse.Action):
    """argparse action for ``KEY=VALUE`` pairs, as mmengine's ``DictAction``: ``--cfg-options a.b=1 c=[1,2]`` ->
    ``{"a.b": 1, "c": [1, 2]}``.

    Values are parsed by :func:`parse_value`; repeated options merge (later keys win). Use it with
    ``nargs="+"`` and pass the result to :meth:`Config.merge_from_dict`.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        options = dict(getattr(namespace, self.dest, None) or {})
        try:
            options.update(parse_overrides([values] if isinstance(values, str) else values))
        except ConfigError as e:
            parser.error(str(e))
        setattr(namespace, self.dest, options)
