"""What a checkpoint holds, and how two differ: the library behind ``trainwright ckpt inspect`` / ``ckpt diff``.

:func:`summarize` lists the pieces, every tensor (shape, dtype, bytes), the run's settings and the versions that wrote
it; :func:`compare` tells tensor by tensor whether two checkpoints are bitwise equal (max abs / max rel difference and
a checksum each) and which settings and other values differ. Both work on a loaded checkpoint dict: reading one (a file,
a sharded directory, a URL) is the caller's (the CLI uses the strategy's ``read_checkpoint``). docs/checkpoints.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from trainwright.checkpoint.migrate import format_version

#: The separator of a value's key path (``model/fc.weight``, ``optim_wrapper/optimizer/state/0/exp_avg``); a
#: setting's path is dotted as in a config (``optim_wrapper.optimizer.lr``).
SEP = "/"
#: Values that differ between any two saves and say nothing about the state (left out of a diff).
VOLATILE = ("meta/time",)


def walk(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(key path, leaf)`` of every tensor and plain value in ``obj`` (mappings and sequences are walked into)."""
    if isinstance(obj, Mapping):
        if not obj and prefix:
            yield prefix, {}
        for k, v in obj.items():
            yield from walk(v, f"{prefix}{SEP}{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)) and not all(_scalar(v) for v in obj):
        for i, v in enumerate(obj):
            yield from walk(v, f"{prefix}{SEP}{i}")
    else:
        yield prefix, obj


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool, complex, bytes))


def checksum(t: torch.Tensor) -> str:
    """The first 12 hex digits of the sha256 of a tensor's bytes (its dtype and shape excluded)."""
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return hashlib.sha256(data).hexdigest()[:12]


def human_bytes(n: int) -> str:
    """``1.5 KiB`` for 1536."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


# --------------------------------------------------------------------------- inspect


@dataclass
class TensorInfo:
    """One tensor of a checkpoint."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass
class PieceInfo:
    """One top-level piece (``model``, ``optim_wrapper``, ``rng``...): its tensors and other values."""

    name: str
    tensors: int = 0
    nbytes: int = 0
    values: int = 0


@dataclass
class Summary:
    """What :func:`summarize` found in a checkpoint."""

    path: str
    pieces: list[PieceInfo]
    tensors: list[TensorInfo]
    meta: dict[str, Any]
    settings: dict[str, Any]
    format_version: int

    @property
    def nbytes(self) -> int:
        """The bytes of every tensor together."""
        return sum(t.nbytes for t in self.tensors)


def summarize(ckpt: Mapping[str, Any], path: str = "checkpoint") -> Summary:
    """The pieces, tensors, ``meta`` (versions, time, seed, progress) and settings (``meta["config"]``) of ``ckpt``."""
    pieces: list[PieceInfo] = []
    tensors: list[TensorInfo] = []
    for name, piece in ckpt.items():
        info = PieceInfo(str(name))
        for key, leaf in walk(piece, str(name)):
            if isinstance(leaf, torch.Tensor):
                nbytes = leaf.numel() * leaf.element_size()
                tensors.append(TensorInfo(key, tuple(leaf.shape), str(leaf.dtype).removeprefix("torch."), nbytes))
                info.tensors, info.nbytes = info.tensors + 1, info.nbytes + nbytes
            else:
                info.values += 1
        pieces.append(info)
    meta = ckpt.get("meta")
    meta = dict(meta) if isinstance(meta, Mapping) else {}
    config = meta.pop("config", None)
    settings = {k.replace(SEP, "."): v for k, v in walk(config)} if isinstance(config, Mapping) else {}
    return Summary(path, pieces, tensors, meta, settings, format_version(ckpt))


def format_summary(s: Summary) -> str:
    """:func:`summarize`'s result as the text ``trainwright ckpt inspect`` prints."""
    m = s.meta
    lines = [
        f"checkpoint {s.path}",
        f"  format {s.format_version}, written by trainwright {m.get('trainwright_version', '?')} with torch "
        f"{m.get('torch_version', '?')}" + (f" at {m['time']}" if "time" in m else ""),
    ]
    run = [f"{k} {m[k]}" for k in ("epoch", "iteration", "seed", "world_size") if k in m]
    if run:
        lines.append("  run: " + ", ".join(run))
    lines.append(f"pieces ({len(s.pieces)}; {len(s.tensors)} tensors, {human_bytes(s.nbytes)}):")
    width = max((len(p.name) for p in s.pieces), default=0)
    for p in s.pieces:
        lines.append(
            f"  {p.name:<{width}}  {p.tensors:>5} tensors {human_bytes(p.nbytes):>10}  {p.values:>5} other values"
        )
    lines.append("tensors:")
    kw = max((len(t.key) for t in s.tensors), default=0)
    for t in s.tensors:
        lines.append(f"  {t.key:<{kw}}  {t.dtype:<9} {str(list(t.shape)):<16} {human_bytes(t.nbytes):>10}")
    lines.append("settings:" if s.settings else "settings: none recorded (meta['config'] is absent)")
    lines.extend(f"  {k} = {v!r}" for k, v in s.settings.items())
    return "\n".join(lines)


# --------------------------------------------------------------------------- diff


@dataclass
class TensorDiff:
    """One tensor key of two checkpoints: ``status`` is ``equal`` (bitwise), ``differs``, ``shape``, ``dtype``,
    ``only in A`` or ``only in B``."""

    key: str
    status: str
    max_abs: float | None = None
    max_rel: float | None = None
    checksum_a: str | None = None
    checksum_b: str | None = None
    detail: str = ""


@dataclass
class ValueDiff:
    """A setting or another plain value that differs (``None`` with ``missing`` naming the side that lacks it)."""

    key: str
    a: Any
    b: Any
    missing: str = ""


@dataclass
class CheckpointDiff:
    """What :func:`compare` found: every tensor, the settings and the other values that differ."""

    tensors: list[TensorDiff] = field(default_factory=list)
    settings: list[ValueDiff] = field(default_factory=list)
    values: list[ValueDiff] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        """Whether the two checkpoints hold the same tensors bitwise, the same settings and the same values."""
        return not self.settings and not self.values and all(t.status == "equal" for t in self.tensors)


def tensor_diff(key: str, a: torch.Tensor, b: torch.Tensor) -> TensorDiff:
    """Compare two tensors: bitwise (by their bytes), else the max abs and max relative difference.

    The relative difference of two elements is ``|a - b| / max(|a|, |b|)`` (0 where both are 0), so it is at most 2
    and defined where one side is 0.
    """
    ca, cb = checksum(a), checksum(b)
    if a.dtype != b.dtype:
        return TensorDiff(key, "dtype", None, None, ca, cb, f"{a.dtype} vs {b.dtype}")
    if a.shape != b.shape:
        return TensorDiff(key, "shape", None, None, ca, cb, f"{list(a.shape)} vs {list(b.shape)}")
    if ca == cb and torch.equal(
        a.detach().cpu().reshape(-1).view(torch.uint8), b.detach().cpu().reshape(-1).view(torch.uint8)
    ):
        return TensorDiff(key, "equal", 0.0, 0.0, ca, cb)
    x, y = a.detach().cpu().double(), b.detach().cpu().double()
    delta = (x - y).abs()
    scale = torch.maximum(x.abs(), y.abs())
    rel = torch.where(scale > 0, delta / scale, torch.zeros_like(delta))
    max_abs = float(delta.nan_to_num(nan=float("inf")).max()) if delta.numel() else 0.0
    max_rel = float(rel.nan_to_num(nan=float("inf")).max()) if rel.numel() else 0.0
    return TensorDiff(key, "differs", max_abs, max_rel, ca, cb)


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> CheckpointDiff:
    """Compare two loaded checkpoints tensor by tensor, setting by setting (``meta["config"]``) and value by value.

    ``meta/time`` (:data:`VOLATILE`) is left out: two saves of the same state are equal.
    """
    out = CheckpointDiff()
    sa, sb = summarize(a), summarize(b)
    for key in sorted(set(sa.settings) | set(sb.settings)):
        va, vb = sa.settings.get(key, _ABSENT), sb.settings.get(key, _ABSENT)
        if va is _ABSENT or vb is _ABSENT or va != vb:
            out.settings.append(_value_diff(key, va, vb))
    la = {k: v for k, v in walk(_without_config(a)) if k not in VOLATILE}
    lb = {k: v for k, v in walk(_without_config(b)) if k not in VOLATILE}
    for key in list(la) + [k for k in lb if k not in la]:
        va, vb = la.get(key, _ABSENT), lb.get(key, _ABSENT)
        if isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor):
            out.tensors.append(tensor_diff(key, va, vb))
        elif isinstance(va, torch.Tensor) or isinstance(vb, torch.Tensor):
            t = va if isinstance(va, torch.Tensor) else vb
            out.tensors.append(
                TensorDiff(
                    key,
                    "only in A" if t is va else "only in B",
                    checksum_a=checksum(t) if t is va else None,
                    checksum_b=checksum(t) if t is vb else None,
                    detail=""
                    if (vb if t is va else va) is _ABSENT
                    else f"the other holds {_short(vb if t is va else va)}",
                )
            )
        elif va is _ABSENT or vb is _ABSENT or not _same(va, vb):
            out.values.append(_value_diff(key, va, vb))
    return out


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


_ABSENT: Any = _Absent()


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(type(a) is type(b) and a == b) or (a != a and b != b)  # noqa: PLR0124 - NaN equals NaN here
    except Exception:  # noqa: BLE001 - values whose == does not give a bool
        return False


def _value_diff(key: str, a: Any, b: Any) -> ValueDiff:
    missing = "A" if a is _ABSENT else "B" if b is _ABSENT else ""
    return ValueDiff(key, None if a is _ABSENT else a, None if b is _ABSENT else b, missing)


def _without_config(ckpt: Mapping[str, Any]) -> dict[str, Any]:
    meta = ckpt.get("meta")
    if not isinstance(meta, Mapping) or "config" not in meta:
        return dict(ckpt)
    return {**ckpt, "meta": {k: v for k, v in meta.items() if k != "config"}}


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def format_diff(d: CheckpointDiff, name_a: str, name_b: str, *, show_equal: bool = False) -> str:
    """:func:`compare`'s result as ``trainwright ckpt diff`` prints it (equal tensors only with ``show_equal``)."""
    counts: dict[str, int] = {}
    for t in d.tensors:
        counts[t.status] = counts.get(t.status, 0) + 1
    lines = [
        f"A: {name_a}",
        f"B: {name_b}",
        f"tensors: {len(d.tensors)} compared: "
        + ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda kv: kv[0] != "equal")),
    ]
    kw = max((len(t.key) for t in d.tensors if show_equal or t.status != "equal"), default=0)
    for t in d.tensors:
        if t.status == "equal" and not show_equal:
            continue
        row = f"  {t.status:<9} {t.key:<{kw}}"
        if t.max_abs is not None:
            row += f"  max abs {t.max_abs:.4g}  max rel {t.max_rel:.4g}"
        if t.detail:
            row += f"  ({t.detail})"
        row += f"  sha256 {t.checksum_a or '-'} / {t.checksum_b or '-'}"
        lines.append(row)
    lines.append("settings that differ:" if d.settings else "settings: the same")
    lines.extend(f"  {v.key}: {_side(v.a, v.missing == 'A')} -> {_side(v.b, v.missing == 'B')}" for v in d.settings)
    lines.append("other values that differ:" if d.values else "other values: the same")
    lines.extend(f"  {v.key}: {_side(v.a, v.missing == 'A')} -> {_side(v.b, v.missing == 'B')}" for v in d.values)
    lines.append("result: equal" if d.equal else "result: different")
    return "\n".join(lines)


def _side(v: Any, absent: bool) -> str:
    return "<absent>" if absent else _short(v)


__all__ = [
    "CheckpointDiff",
    "PieceInfo",
    "Summary",
    "TensorDiff",
    "TensorInfo",
    "ValueDiff",
    "checksum",
    "compare",
    "format_diff",
    "format_summary",
    "summarize",
    "tensor_diff",
    "walk",
]
