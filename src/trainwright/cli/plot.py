"""``trainwright plot``: loss / metric / lr curves from ``metrics.jsonl``, several runs overlaid."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainwright.registry import ConfigError, did_you_mean

_META = ("mode", "epoch", "iter")


def find_metric_files(path: str | Path) -> list[Path]:
    """The ``metrics.jsonl`` files of ``path``: the file itself, a run folder's, or every run folder's of a work dir
    (oldest first)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if (path / "metrics.jsonl").is_file():
        return [path / "metrics.jsonl"]
    files = sorted(path.glob("*/metrics.jsonl"), key=lambda p: p.stat().st_mtime)
    if not files:
        what = "does not exist" if not path.exists() else "holds no metrics.jsonl (nor do its run folders)"
        raise ConfigError(
            f"{str(path)!r} {what}; give a work dir (as --work-dir of train), a run folder, or a metrics.jsonl file"
        )
    return files


def _read(file: Path) -> list[dict[str, Any]]:
    records = []
    for line in file.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if isinstance(rec, dict) and "iter" in rec:
            records.append(rec)
    return records


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of one run: its run folders' ``metrics.jsonl`` merged (a resumed run continues the curve), by
    iteration.

    Run folders of standalone evaluations (``trainwright val`` / ``test``, ``trainer.val()``
    without training: no training record) are left out when the work dir holds a training
    run: their iteration is that of the weights they loaded (0), not a point of the training
    curves. Give such a run folder itself to plot it.
    """
    files = [(f, _read(f)) for f in find_metric_files(path)]
    trained = [(f, recs) for f, recs in files if any(r.get("mode", "train") == "train" for r in recs)]
    by_key: dict[tuple[str, int], dict[str, Any]] = {}
    for _, recs in trained or files:
        for rec in recs:
            by_key[(str(rec.get("mode", "train")), int(rec["iter"]))] = rec  # a later run folder wins (resume)
    return sorted(by_key.values(), key=lambda r: (int(r["iter"]), r.get("mode") != "train"))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x


def default_keys(runs: Sequence[list[dict[str, Any]]]) -> list[str]:
    """``loss``, the evaluation metrics (``val/...``, ``test/...``) and ``lr``, as far as the runs logged them."""
    present = {k for recs in runs for r in recs for k in r if k not in _META and _number(r[k]) is not None}
    evals = sorted(k for k in present if "/" in k and k.split("/", 1)[0] in ("val", "test"))
    return [k for k in ("loss", *evals, "lr") if k in present]


def plot_runs(paths: Sequence[str | Path], keys: Sequence[str] | None = None, out: str | Path = "curves.png") -> Path:
    """Draw one panel per key with one line per run and write the PNG ``out``.

    Raises:
        ConfigError: a path without metrics, or a key no run logged (close matches named).
    """
    runs = [load_records(p) for p in paths]
    present = sorted({k for recs in runs for r in recs for k in r if k not in _META})
    keys = list(keys) if keys else default_keys(runs)
    for k in keys:
        if k not in present:
            raise ConfigError(f"No run logged {k!r}.{did_you_mean(k, present)} Logged keys: {present}")
    if not keys:
        raise ConfigError(f"Nothing to plot: the runs logged no numbers (keys: {present}); train first, or pass --keys")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(len(keys), 3)
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.0 * ncols, 3.6 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for label, recs in zip(paths, runs):
            pts = [(int(r["iter"]), _number(r[key])) for r in recs if key in r and _number(r[key]) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, markersize=3, label=str(label))
        ax.set_title(key)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        if key == "lr" or key.endswith(".lr"):
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        if len(paths) > 1:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
