"""How long does saving a checkpoint stall training? Sync vs async save of a model with SGD momentum.

Run:  python benchmarks/checkpoint.py [--params 100e6 | --state-mb 300] [--repeats 5] [--dir DIR] [--device cuda]

Every repeat takes an optimizer step (the state changes in place, as in training), then
times, on the training thread: a synchronous save (collect the state dicts, ``make_safe``,
atomic write, ``latest``), an async save (collect, ``make_safe``, copy into the staging
buffers; the write runs in the writer thread, waited for untimed) and a fresh copy with
``snapshot()`` (what an async save cost before the buffers were reused). The first async
save allocates the buffers and is reported apart. A raw-disk baseline (``os.write`` +
``fsync`` of the same number of bytes, same directory) shows the disk's speed in this run.
The stall ratio (async blocked / sync blocked) is printed as the ratio of the medians and
the spread of each repeat's own ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainwright.checkpoint.async_writer import AsyncCheckpointWriter, snapshot
from trainwright.checkpoint.io import atomic_save
from trainwright.checkpoint.listing import write_latest
from trainwright.checkpoint.stateful import make_safe


def big_model(params: float) -> nn.Module:
    """A stack of square Linear layers with about ``params`` parameters (width 4096, or 1024 below 34M)."""
    width = 4096 if params >= 2 * 4096 * 4096 else 1024
    layers = max(1, round(params / (width * width + width)))
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def raw_disk_write(path: Path, nbytes: int, chunk: int = 64 << 20) -> float:
    """Seconds to write ``nbytes`` with os.write and fsync (the disk's raw speed in this run)."""
    buf = os.urandom(min(chunk, nbytes))
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, buf[: min(len(buf), left)])
        os.fsync(fd)
    finally:
        os.close(fd)
    dt = time.perf_counter() - t0
    path.unlink()
    return dt


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.4f} [{min(xs):.4f}-{max(xs):.4f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--params", type=float, default=100e6, help="model parameters (default 100e6: 768 MiB with momentum)"
    )
    parser.add_argument(
        "--state-mb",
        type=float,
        default=None,
        help="size the model so weights + momentum are about this many MiB (overrides --params)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed saves per mode (after one warm-up async save)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--device", default="cpu", help="where the model lives (cpu, cuda)")
    args = parser.parse_args()
    params = args.state_mb * 2**20 / 8 if args.state_mb is not None else args.params
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = big_model(params).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    for p in model.parameters():  # materialise momentum buffers: the checkpoint holds them too
        p.grad = torch.full_like(p, 1e-3)
    opt.step()

    def collect() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": opt.state_dict()}

    nbytes = sum(
        t.numel() * t.element_size()
        for t in list(model.state_dict().values()) + [s["momentum_buffer"] for s in opt.state.values()]
    )
    rows: dict[str, list[float]] = {
        k: [] for k in ("raw", "sync", "sync_total", "async", "async_total", "collect", "make_safe", "stage", "fresh")
    }
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        out = Path(d)
        writer = AsyncCheckpointWriter()
        t0 = time.perf_counter()
        writer.submit(make_safe(collect()), out / "warmup.pth")
        first = time.perf_counter() - t0
        writer.wait()
        (out / "warmup.pth").unlink()
        for r in range(args.repeats):
            rows["raw"].append(raw_disk_write(out / "raw.bin", nbytes))

            opt.step()  # training changes the state in place between saves
            _sync(device)
            t0 = time.perf_counter()
            atomic_save(make_safe(collect()), out / f"sync_{r}.pth")
            write_latest(out, f"sync_{r}.pth")
            rows["sync"].append(time.perf_counter() - t0)
            rows["sync_total"].append(rows["sync"][-1])
            (out / f"sync_{r}.pth").unlink()

            opt.step()
            _sync(device)
            t0 = time.perf_counter()
            state = collect()
            t1 = time.perf_counter()
            state = make_safe(state)
            t2 = time.perf_counter()
            writer.submit(state, out / f"async_{r}.pth", after=lambda r=r: write_latest(out, f"async_{r}.pth"))
            t3 = time.perf_counter()
            del state
            writer.wait()
            rows["async_total"].append(time.perf_counter() - t0)
            rows["async"].append(t3 - t0)
            rows["collect"].append(t1 - t0)
            rows["make_safe"].append(t2 - t1)
            rows["stage"].append(t3 - t2)
            (out / f"async_{r}.pth").unlink()

            t0 = time.perf_counter()
            fresh = snapshot(make_safe(collect()))
            rows["fresh"].append(time.perf_counter() - t0)
            del fresh
        writer.release()
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")
    print(
        f"model: {n_params / 1e6:.1f}M parameters, checkpoint {nbytes / 2**20:.0f} MiB (weights + momentum), "
        f"{args.repeats} repeats: median [min-max]"
    )
    print(f"{'mode':<44}{'loop blocked (s)':>30}{'until on disk (s)':>20}{'MiB/s':>8}{'% raw':>7}")
    for name, blocked, total in (
        ("raw disk (os.write+fsync)", None, "raw"),
        ("sync save", "sync", "sync_total"),
        ("async save (reused staging buffers)", "async", "async_total"),
    ):
        shown = f"{'-':>30}" if blocked is None else f"{_med(rows[blocked]):>30}"
        print(
            f"{name:<44}{shown}{med[total]:>20.3f}{nbytes / 2**20 / med[total]:>8.0f}"
            f"{100 * med['raw'] / med[total]:>6.0f}%"
        )
    print(f"{'  of which: collect state dicts':<44}{_med(rows['collect']):>30}")
    print(f"{'            make_safe':<44}{_med(rows['make_safe']):>30}")
    print(f"{'            copy into staging buffers':<44}{_med(rows['stage']):>30}")
    print(f"{'first async save (allocates the buffers)':<44}{first:>30.4f}")
    print(f"{'fresh copy, snapshot() (the old async stall)':<44}{_med(rows['fresh']):>30}")
    ratios = [a / s for a, s in zip(rows["async"], rows["sync"])]
    print(
        f"async stall / sync stall: {med['async'] / med['sync']:.1%} (ratio of medians; per repeat "
        f"{statistics.median(ratios):.1%} [{min(ratios):.1%}-{max(ratios):.1%}]); fresh copy / sync: "
        f"{med['fresh'] / med['sync']:.1%}"
    )


if __name__ == "__main__":
    main()
