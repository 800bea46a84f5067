"""What ``verify-resume`` compares: the probes' step records and the final checkpoints of two runs, bitwise."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainwright.checkpoint.io import load_file

__all__ = [
    "Check",
    "ResumeReport",
    "RunRecords",
    "compare_checkpoints",
    "compare_steps",
    "compare_validation",
    "first_difference",
    "read_checkpoint",
    "restart_check",
]

#: The checkpoint pieces compared, by the name of the check: where each lives in a trainwright checkpoint.
STATE_CHECKS: dict[str, tuple[str, ...]] = {
    "parameters": ("model",),
    "optimizer": ("optim_wrapper",),
    "schedulers": ("param_schedulers",),
    "random streams": ("rng",),
    "data position": ("progress", "train_dataloader"),
}


@dataclass
class Check:
    """One row of the report: what was compared, whether it was equal, and where it first differed."""

    name: str
    ok: bool
    #: Where it first differed (the step, the tensor, the values); for an equal check, what was compared.
    detail: str = ""
    #: The training step of the first difference (None: none, or a final state).
    step: int | None = None

    def where(self) -> str:
        """The detail, after ``step N:`` when the difference has a step."""
        return f"step {self.step}: {self.detail}" if self.step is not None and not self.ok else self.detail


@dataclass
class ResumeReport:
    """The outcome of a resume verification: one :class:`Check` per compared piece.

    Attributes:
        checks: The rows, in the order of the table.
        steps: The steps each run trained.
        restarts: The iterations the interrupted run stopped at and restarted from, in a fresh process each.
        work_dir: The folder holding both runs (``reference/``, ``resumed/``: logs, records, checkpoints).
    """

    checks: list[Check]
    steps: int
    restarts: list[int]
    work_dir: Path
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every check found the runs bitwise equal."""
        return all(c.ok for c in self.checks)

    @property
    def first_divergence(self) -> Check | None:
        """The failing check that diverged first (the earliest step; a final state after every step check)."""
        failed = [c for c in self.checks if not c.ok]
        if not failed:
            return None
        return min(failed, key=lambda c: (c.step is None, c.step or 0))

    def table(self) -> str:
        """The report as text: a row per check (check / result / first divergence), then the first divergence."""
        rows = [("check", "result", "first divergence")] + [
            (c.name, "equal" if c.ok else "DIFFERS", c.where()) for c in self.checks
        ]
        width = [max(len(r[i]) for r in rows) for i in range(2)]
        lines = [f"{a:<{width[0]}}  {b:<{width[1]}}  {c}".rstrip() for a, b, c in rows]
        where = ", ".join(str(k) for k in self.restarts)
        head = f"verify-resume: {self.steps} steps uninterrupted vs. restarted in fresh processes at {where}"
        first = self.first_divergence
        if first is None:
            tail = "resume is exact: every check is bitwise equal"
        else:
            tail = f"FIRST DIVERGENCE: {first.name}, {first.where()}"
        return "\n".join([head, *self.notes, "", *lines, "", tail, f"runs kept in {self.work_dir.resolve()}"])

    def __str__(self) -> str:
        return self.table()


class RunRecords:
    """The records the probes of one run wrote (every segment, every rank), read back."""

    def __init__(self, files: Mapping[tuple[int, int], Path]) -> None:
        self.starts: dict[tuple[int, int], dict[str, Any]] = {}
        self.ends: dict[tuple[int, int], dict[str, Any]] = {}
        #: rank -> iteration -> (segment, record); a step recorded twice keeps every copy in ``repeated``.
        self.steps: dict[int, dict[int, dict[str, Any]]] = {}
        self.repeated: list[tuple[int, int]] = []
        #: rank -> iteration -> the metrics of the validation after it (exact hex floats).
        self.vals: dict[int, dict[int, dict[str, str]]] = {}
        for (segment, rank), path in sorted(files.items()):
            for line in path.read_text(encoding="utf-8").splitlines():
                rec = json.loads(line)
                if "start" in rec:
                    self.starts[(segment, rank)] = rec
                elif "val" in rec:
                    self.vals.setdefault(rank, {})[rec["val"]] = rec["metrics"]
                elif "end" in rec:
                    self.ends[(segment, rank)] = rec
                else:
                    steps = self.steps.setdefault(rank, {})
                    if rec["iter"] in steps:
                        self.repeated.append((rank, rec["iter"]))
                    steps[rec["iter"]] = rec

    def checkpoint(self, segment: int) -> str | None:
        """The checkpoint rank 0's probe saved at the end of ``segment``."""
        end = self.ends.get((segment, 0))
        return None if end is None else end.get("checkpoint")


def _rank(rank: int, world: int) -> str:
    return f"rank {rank}: " if world > 1 else ""


def _loss_text(hexes: Mapping[str, str], key: str) -> str:
    return repr(float.fromhex(hexes[key])) if key in hexes else "absent"


def compare_steps(ref: RunRecords, run: RunRecords, steps: int, world: int) -> list[Check]:
    """The ``batches`` and ``losses`` checks: every step of every rank, in order; the first difference of each."""
    batch: Check | None = None
    loss: Check | None = None
    for it in range(1, steps + 1):
        for rank in range(world):
            a, b = ref.steps.get(rank, {}).get(it), run.steps.get(rank, {}).get(it)
            where = _rank(rank, world)
            if a is None or b is None:
                missing = "the uninterrupted run" if a is None else "the restarted run"
                text = f"{where}not trained by {missing}"
                batch = batch or Check("batches", False, text, it)
                loss = loss or Check("losses", False, text, it)
                continue
            if batch is None and a["batch"] != b["batch"]:
                batch = Check("batches", False, f"{where}another batch (checksum {b['batch']} != {a['batch']})", it)
            if loss is None and a["losses"] != b["losses"]:
                key = next(
                    k for k in sorted(set(a["losses"]) | set(b["losses"])) if a["losses"].get(k) != b["losses"].get(k)
                )
                loss = Check(
                    "losses",
                    False,
                    f"{where}{key} {_loss_text(b['losses'], key)} != {_loss_text(a['losses'], key)}",
                    it,
                )
        if batch is not None and loss is not None:
            break
    n = f"{steps} steps" + (f" x {world} ranks" if world > 1 else "")
    return [batch or Check("batches", True, f"{n}, a checksum per batch"), loss or Check("losses", True, n)]


def compare_validation(ref: RunRecords, run: RunRecords) -> Check:
    """The ``validation`` check: the metrics of every validation during training (rank 0's; every rank has the
    gathered ones), at the same iterations, bitwise."""
    a, b = ref.vals.get(0, {}), run.vals.get(0, {})
    for it in sorted(set(a) | set(b)):
        if it not in a or it not in b:
            return Check(
                "validation", False, f"validated only by the {'uninterrupted' if it in a else 'restarted'} run", it
            )
        if a[it] != b[it]:
            key = next(k for k in sorted(set(a[it]) | set(b[it])) if a[it].get(k) != b[it].get(k))
            return Check("validation", False, f"{key} {_loss_text(b[it], key)} != {_loss_text(a[it], key)}", it)
    if not a:
        return Check("validation", True, "no validation in the run")
    return Check("validation", True, f"{len(a)} validation(s), after step {', '.join(map(str, sorted(a)))}")


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint, whole, in this process: a file by the safe loader, a sharded directory as full tensors."""
    p = Path(path)
    if p.is_dir():
        from trainwright.strategies.dcp_io import load_full

        return load_full(p)
    return load_file(p)


def compare_checkpoints(ref: Mapping[str, Any], run: Mapping[str, Any], step: int) -> list[Check]:
    """One check per :data:`STATE_CHECKS` entry: the pieces of the two final checkpoints, bitwise."""
    checks = []
    for name, pieces in STATE_CHECKS.items():
        held = [p for p in pieces if p in ref or p in run]
        if not held:
            checks.append(Check(name, True, "not in the checkpoints"))
            continue
        diff = None
        for piece in held:
            if piece not in ref or piece not in run:
                diff = f"{piece}: only in the {'uninterrupted' if piece in ref else 'restarted'} run's checkpoint"
            else:
                diff = first_difference(ref[piece], run[piece], "" if name == "parameters" else piece)
            if diff:
                break
        what = f"the checkpoint at step {step}"
        checks.append(Check(name, True, what) if diff is None else Check(name, False, f"{diff} ({what})"))
    return checks


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where ``b`` first differs from ``a`` (a dotted path and how), bitwise; None when equal."""
    name = path or "(the piece)"
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{name}: {type(b).__name__} != {type(a).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{name}: {b.dtype}{tuple(b.shape)} != {a.dtype}{tuple(a.shape)}"
        if _bits(a) == _bits(b):
            return None
        if a.is_floating_point() or a.is_complex():
            d = (b.detach().double() - a.detach().double()).abs()
            d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)
            return f"{name}: max abs difference {d.max().item():.3g} ({int((d != 0).sum())} of {a.numel()} values)"
        return f"{name}: {int((a != b).sum())} of {a.numel()} values differ"
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in a:
            if k not in b:
                return f"{_join(path, k)}: only in the uninterrupted run"
            found = first_difference(a[k], b[k], _join(path, k))
            if found:
                return found
        extra = [k for k in b if k not in a]
        return f"{_join(path, extra[0])}: only in the restarted run" if extra else None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{name}: {len(b)} items != {len(a)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, _join(path, i))
            if found:
                return found
        return None
    if isinstance(a, float) and isinstance(b, float):
        return None if a.hex() == b.hex() else f"{name}: {b!r} != {a!r}"
    return None if type(a) is type(b) and a == b else f"{name}: {b!r} != {a!r}"


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _bits(t: torch.Tensor) -> bytes:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes())


def restart_check(run: RunRecords, restarts: Sequence[int], world: int) -> Check:
    """The ``restarts`` check: each fresh process resumed exactly where the previous one stopped."""
    for segment, k in enumerate(restarts, start=1):
        for rank in range(world):
            start = run.starts.get((segment, rank), {}).get("start")
            if start != k:
                got = "did not start" if start is None else f"started at iteration {start}"
                return Check(
                    "restarts",
                    False,
                    f"{_rank(rank, world)}the process restarted after step {k} {got}: it did not resume from the "
                    "checkpoint saved at the stop",
                    k + 1,
                )
    if run.repeated:
        rank, it = run.repeated[0]
        return Check("restarts", False, f"{_rank(rank, world)}trained twice", it)
    n = len(restarts)
    return Check(
        "restarts", True, f"{n} fresh process{'es' if n > 1 else ''} resumed at {', '.join(map(str, restarts))}"
    )
