"""What a sweep varies and toward what: the ``--param`` distributions and their checks.

:func:`parse_param` turns ``KEY=DIST:...`` text into a :class:`Param`, :func:`check_params`
checks the keys against the config, :func:`resolve_direction` reads ``max`` / ``min``, and
:func:`require_optuna` names the extra when Optuna is missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainwright.config.overrides import parse_value
from trainwright.hooks.checkpoint import infer_rule
from trainwright.registry import ConfigError, did_you_mean

#: The distributions a ``--param`` may name, with the form each takes.
DISTRIBUTIONS: dict[str, str] = {
    "loguniform": "loguniform:LOW:HIGH (floats, 0 < LOW < HIGH, sampled on a log scale)",
    "uniform": "uniform:LOW:HIGH (floats, LOW < HIGH)",
    "int": "int:LOW:HIGH[:log] (integers, LOW < HIGH, both included)",
    "choice": "choice:A,B,C (values: int, float, bool, none or string)",
}
_DIRECTIONS = {"max": "maximize", "maximize": "maximize", "min": "minimize", "minimize": "minimize"}
_INSTALL = "pip install 'trainwright[optuna]'"


@dataclass(frozen=True)
class Param:
    """One swept config key and its distribution (see :data:`DISTRIBUTIONS`).

    Attributes:
        key: Dotted config key (``optim_wrapper.optimizer.lr``), as ``--cfg-options`` takes it.
        kind: ``"loguniform"``, ``"uniform"``, ``"int"`` or ``"choice"``.
        low: Lower bound (ranges).
        high: Upper bound (ranges, included).
        log: Sample on a log scale (``loguniform``; ``int:a:b:log``).
        choices: The values of a ``choice``.
    """

    key: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def distribution(self) -> Any:
        """The Optuna distribution of this parameter."""
        optuna = require_optuna()
        d = optuna.distributions
        if self.kind == "choice":
            return d.CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return d.IntDistribution(int(self.low or 0), int(self.high or 0), log=self.log)
        return d.FloatDistribution(float(self.low or 0.0), float(self.high or 0.0), log=self.log)

    def spec(self) -> str:
        """The ``KEY=DIST:...`` text this parameter is parsed from (normalised)."""
        if self.kind == "choice":
            return f"{self.key}=choice:{','.join(str(c) for c in self.choices)}"
        if self.kind == "int":
            return f"{self.key}=int:{int(self.low or 0)}:{int(self.high or 0)}{':log' if self.log else ''}"
        return f"{self.key}={self.kind}:{self.low!r}:{self.high!r}"


def parse_param(text: str) -> Param:
    """``"optim_wrapper.optimizer.lr=loguniform:1e-4:1e-1"`` -> a :class:`Param`.

    Raises:
        ConfigError: no ``=``, an empty key, an unknown distribution, or a malformed range
            (wrong number of bounds, bounds that are not numbers, low >= high, a log scale
            with a bound <= 0, an empty or repeated choice).
    """
    key, sep, dist = text.partition("=")
    key = key.strip()
    forms = "; ".join(DISTRIBUTIONS.values())
    if not sep or not dist.strip():
        raise ConfigError(
            f"--param {text!r} needs KEY=DISTRIBUTION, e.g. optim_wrapper.optimizer.lr=loguniform:1e-4:1e-1 "
            f"(distributions: {forms})"
        )
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"--param {text!r}: the key is empty or has an empty part; write a dotted config key such as "
            "optim_wrapper.optimizer.lr"
        )
    kind, _, rest = dist.strip().partition(":")
    kind = kind.strip().lower()
    where = f"--param {text!r}"
    if kind not in DISTRIBUTIONS:
        raise ConfigError(
            f"{where}: unknown distribution {kind!r}.{did_you_mean(kind, list(DISTRIBUTIONS))} Use one of: {forms}"
        )
    if kind == "choice":
        return Param(key, kind, choices=_parse_choices(rest, where))
    parts = [p.strip() for p in rest.split(":")] if rest.strip() else []
    log = False
    if kind == "int" and len(parts) == 3:
        if parts[2].lower() != "log":
            raise ConfigError(f"{where}: the third field of int:LOW:HIGH:log may only be 'log', got {parts[2]!r}")
        parts, log = parts[:2], True
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{where}: {kind} needs two bounds, written {DISTRIBUTIONS[kind]}; got {rest!r}")
    low, high = (_number(p, kind, where) for p in parts)
    if not low < high:
        raise ConfigError(
            f"{where}: the low bound {parts[0]} must be smaller than the high bound {parts[1]}; swap them"
        )
    if kind == "loguniform":
        log = True
    if log and low <= 0:
        raise ConfigError(
            f"{where}: a log scale needs bounds > 0, got {parts[0]}; use uniform:{parts[0]}:{parts[1]} or a positive "
            "low bound"
        )
    return Param(key, kind, low=low, high=high, log=log)


def _number(text: str, kind: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a number; {kind} is written {DISTRIBUTIONS[kind]}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{where}: the bound {text!r} is not finite; give finite numbers")
    if kind == "int":
        if not value.is_integer():
            raise ConfigError(
                f"{where}: int bounds must be whole numbers, got {text!r}; use uniform:LOW:HIGH for floats"
            )
        return int(value)
    return value


def _parse_choices(rest: str, where: str) -> tuple[Any, ...]:
    if not rest.strip():
        raise ConfigError(f"{where}: choice needs at least one value, written {DISTRIBUTIONS['choice']}")
    values = []
    for item in rest.split(","):
        if not item.strip():
            raise ConfigError(f"{where}: choice has an empty value (two commas in a row, or a trailing comma)")
        try:
            value = parse_value(item)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise ConfigError(
                f"{where}: choice values must be int, float, bool, none or strings; {item.strip()!r} is a "
                f"{type(value).__name__}"
            )
        values.append(value)
    seen: list[Any] = []
    for v in values:
        if any(type(v) is type(s) and v == s for s in seen):
            raise ConfigError(f"{where}: choice lists {v!r} twice; give each value once")
        seen.append(v)
    return tuple(values)


def check_params(cfg: Mapping[str, Any], params: Sequence[Param]) -> None:
    """Check that every parameter names a key of ``cfg`` that holds a value (not a dict of keys).

    Raises:
        ConfigError: a key given twice, or one ``cfg`` does not have (the message names the
            closest keys at the level where the path broke off).
    """
    seen: set[str] = set()
    for p in params:
        if p.key in seen:
            raise ConfigError(f"--param {p.key} is given twice; give each key once")
        seen.add(p.key)
        node: Any = cfg
        parts = p.key.split(".")
        for i, part in enumerate(parts):
            here = ".".join(parts[:i]) or "the config"
            if isinstance(node, Mapping):
                if part not in node:
                    keys = [str(k) for k in node if not str(k).startswith("_")]
                    raise ConfigError(
                        f"--param {p.key}: {here} has no key {part!r}.{did_you_mean(part, keys)} Its keys: "
                        f"{sorted(keys)}. "
                        "Sweep keys the config sets (add the key to the config, e.g. with its default value, to sweep "
                        "it)"
                    )
                node = node[part]
            elif isinstance(node, (list, tuple)):
                if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
                    raise ConfigError(
                        f"--param {p.key}: {here} is a list of {len(node)} items; {part!r} is not an index of it"
                    )
                node = node[int(part)]
            else:
                raise ConfigError(
                    f"--param {p.key}: {here} is a {type(node).__name__} ({node!r}), not a dict; sweep {here} itself"
                )
        if isinstance(node, Mapping):
            raise ConfigError(
                f"--param {p.key}: {p.key} is a dict; sweep one of its keys, e.g. "
                f"{', '.join(f'{p.key}.{k}' for k in list(node)[:3])}"
            )


def require_optuna() -> Any:
    """The ``optuna`` module, or a ConfigError naming the extra that installs it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            f"trainwright sweep needs Optuna, which is not installed: {_INSTALL} (or pip install optuna)"
        ) from None
    return optuna


def resolve_direction(direction: str | None, metric: str) -> str:
    """``"maximize"`` or ``"minimize"`` from ``max`` / ``min`` (or the long names); None: inferred from the metric's
    name."""
    if direction is None:
        try:
            return "maximize" if infer_rule(metric) == "greater" else "minimize"
        except ValueError:
            raise ConfigError(
                f"cannot tell whether a higher or a lower {metric!r} is better; pass --direction max or --direction min"
            ) from None
    d = _DIRECTIONS.get(str(direction).lower())
    if d is None:
        raise ConfigError(f"--direction {direction!r} is not a direction; use max or min")
    return d
