"""Speed and memory of fp32 vs bf16-mixed vs 16-mixed vs bf16-true training steps on the digits model.

Each precision runs in its own subprocess (so peak RSS is its own): the engine's real
training step (``model.train_step(batch, optim_wrapper)``: preprocess, autocast forward +
loss, scaled backward, unscale + clip, step) is timed over ``--steps`` iterations after
``--warmup`` ones. Memory is the peak resident set size during the timed steps minus the
resident size before the first step. With ``--epochs N`` the demo trainer is also run for
N epochs and its validation accuracy reported.

Run::

    python benchmarks/precision.py                       # batch 32 (the demo's), 10 epochs for accuracy
    python benchmarks/precision.py --batch-size 512 --hidden 2048 --epochs 0   # a wider, heavier step
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("32", "bf16-mixed", "16-mixed", "bf16-true")


def _digits_config():
    """The demo config (loading it registers DigitsNet and DigitsDataset)."""
    from trainwright.config import Config

    return Config.fromfile(ROOT / "examples" / "digits.py")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(precision: str, batch_size: int, hidden: int, steps: int, warmup: int, epochs: int) -> dict:
    """Time ``steps`` training steps in ``precision``; optionally train the demo for accuracy."""
    from trainwright.amp import build_precision
    from trainwright.optim import OptimWrapper
    from trainwright.registry import DATASETS, MODELS

    cfg = _digits_config()
    torch.manual_seed(0)
    model = MODELS.build(dict(type="DigitsNet", hidden=hidden))
    train_set = DATASETS.build(dict(type="DigitsDataset", split="train"))
    x, y = train_set.tensors
    idx = torch.randint(0, len(x), (warmup + steps, batch_size), generator=torch.Generator().manual_seed(0))
    batches = [(x[i], y[i]) for i in idx]
    prec = build_precision(precision, "cpu")
    prec.convert_module(model)  # as the strategy does before the optimizer is built (bf16-true casts the weights)
    ow = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), clip_grad=dict(max_norm=1.0), precision=prec
    )
    model.train()
    base = _rss_mib()
    for b in batches[:warmup]:
        model.train_step(b, ow)
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        model.train_step(b, ow)
    elapsed = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "precision": precision,
        "batch_size": batch_size,
        "hidden": hidden,
        "steps_per_s": steps / elapsed,
        "ms_per_step": 1e3 * elapsed / steps,
        "peak_rss_delta_mib": peak - base,
    }
    if epochs > 0:
        with tempfile.TemporaryDirectory() as tmp:
            from trainwright import Trainer

            cfg.merge_from_dict({"train_cfg.max_epochs": epochs, "param_scheduler.1.end": epochs})
            trainer = Trainer.from_config(cfg, work_dir=tmp, precision=precision, log_level="WARNING")
            trainer.train()
            out["val_acc"] = trainer.val()["val/acc"]
            trainer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128, help="hidden width of the MLP (the demo's is 128)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument(
        "--epochs", type=int, default=10, help="also train the demo this many epochs and report val acc (0: skip)"
    )
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker, args.batch_size, args.hidden, args.steps, args.warmup, args.epochs)))
        return
    rows = []
    for p in args.precisions:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            p,
            "--batch-size",
            str(args.batch_size),
            "--hidden",
            str(args.hidden),
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--epochs",
            str(args.epochs),
        ]
        rows.append(
            json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        )
    cpu = platform.processor() or platform.machine()
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPU cores ({cpu}), threads {torch.get_num_threads()}, batch "
        f"{args.batch_size}, hidden {args.hidden}, {args.steps} timed steps"
    )
    base = rows[0]["steps_per_s"] if rows[0]["precision"] == "32" else None
    head = "| precision | steps/s | ms/step | vs fp32 | peak RSS delta (MiB) |" + (
        " val acc |" if args.epochs > 0 else ""
    )
    print(head)
    print("|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|")
    for r in rows:
        rel = f"{r['steps_per_s'] / base:.2f}x" if base else "-"
        line = (
            f"| {r['precision']} | {r['steps_per_s']:.0f} | {r['ms_per_step']:.2f} | {rel} | "
            f"{r['peak_rss_delta_mib']:.1f} |"
        )
        if args.epochs > 0:
            line += f" {r['val_acc']:.4f} |"
        print(line)


if __name__ == "__main__":
    main()
