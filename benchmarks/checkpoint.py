"""How long does saving a checkpoint stall training? Sync vs async save of a ~100M-parameter model.

Run:  python benchmarks/checkpoint.py [--params 100e6] [--repeats 3] [--dir DIR]

For each mode the table shows the time the training loop is blocked (sync: the whole
atomic write; async: the copy of the state to CPU memory only), the time until the file
is complete on disk, and the write throughput, next to a raw-disk baseline: the same
number of bytes written with ``os.write`` + ``fsync`` in the same directory, in this run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from trainwright.checkpoint.async_writer import AsyncCheckpointWriter
from trainwright.checkpoint.io import atomic_save, write_latest


def big_model(params: float) -> nn.Module:
    """A stack of square Linear layers with about ``params`` parameters."""
    width = 4096
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = big_model(args.params)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():  # materialise momentum buffers: the checkpoint holds them too
        p.grad = torch.zeros_like(p)
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    nbytes = sum(t.numel() * t.element_size() for t in list(state["model"].values()) + [s["momentum_buffer"] for s in opt.state.values()])
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        out = Path(d)
        rows: dict[str, list[tuple[float, float]]] = {"raw disk (os.write+fsync)": [], "sync save": [], "async save": []}
        writer = AsyncCheckpointWriter()
        for r in range(args.repeats):
            dt = raw_disk_write(out / "raw.bin", nbytes)
            rows["raw disk (os.write+fsync)"].append((dt, dt))
            t0 = time.perf_counter()
            atomic_save(state, out / f"sync_{r}.pth")
            write_latest(out, f"sync_{r}.pth")
            dt = time.perf_counter() - t0
            rows["sync save"].append((dt, dt))
            (out / f"sync_{r}.pth").unlink()
            t0 = time.perf_counter()
            writer.submit(state, out / f"async_{r}.pth", after=lambda r=r: write_latest(out, f"async_{r}.pth"))
            blocked = time.perf_counter() - t0
            writer.wait()
            rows["async save"].append((blocked, time.perf_counter() - t0))
            (out / f"async_{r}.pth").unlink()
    print(f"model: {n_params / 1e6:.1f}M parameters, checkpoint {nbytes / 2**20:.0f} MiB (weights + momentum), median of {args.repeats}")
    print(f"{'mode':<28}{'loop blocked (s)':>18}{'until on disk (s)':>20}{'MiB/s':>10}{'% of raw':>10}")
    raw = statistics.median(t for _, t in rows["raw disk (os.write+fsync)"])
    sync_blocked = statistics.median(b for b, _ in rows["sync save"])
    for name, vals in rows.items():
        total = statistics.median(t for _, t in vals)
        shown = f"{'-':>18}" if name.startswith("raw") else f"{statistics.median(b for b, _ in vals):>18.3f}"
        print(f"{name:<28}{shown}{total:>20.3f}{nbytes / 2**20 / total:>10.0f}{100 * raw / total:>9.0f}%")
    async_blocked = statistics.median(b for b, _ in rows["async save"])
    print(f"async stall / sync stall: {async_blocked / sync_blocked:.1%}")


if __name__ == "__main__":
    main()
