"""Does resuming a stream cost the same wherever it stopped? Time to the first batch after a resume at batch 10 and at
batch 10,000 of a Hugging Face streaming dataset (local JSON-lines shards, 2 loader workers).

Run:  python benchmarks/stream_resume.py [--batches 10 10000] [--batch-size 8] [--shards 32] [--repeats 3]
      [--replay]

The state at each batch is taken once (untimed: the stream is read up to it). Each repeat then builds the train loader
as a Trainer does (``build_dataloader(dict(dataset=..., batch_size=..., num_workers=2))``: a ``StatefulDataLoader``),
restores the position (``load_state_dict`` + ``load_stream_state``, what the ``data_state`` checkpoint piece does) and
times until the first batch arrives: the workers start and each restores its shard position. ``--replay`` also times
the same resume by reading the stream again (``stateful=False``, the path a stream without state takes), once per
position. Medians are printed with the ratio of the two positions (the target: within 2x).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from trainwright.data.loader import ResumableLoader, build_dataloader


def write_shards(folder: Path, samples: int, shards: int) -> list[str]:
    """``shards`` JSON-lines files holding ids ``0..samples-1`` (a text field too, as a corpus would)."""
    per = -(-samples // shards)
    files = []
    for s in range(shards):
        path = folder / f"shard{s:03d}.jsonl"
        with path.open("w") as f:
            for i in range(s * per, min(samples, (s + 1) * per)):
                f.write(json.dumps({"id": i, "text": f"sample {i} " * 8}) + "\n")
        files.append(str(path))
    return files


def loader(files: list[str], batch_size: int, stateful: bool = True) -> ResumableLoader:
    import datasets

    ds = datasets.load_dataset("json", data_files=files, split="train", streaming=True).select_columns(["id"])
    return build_dataloader(dict(dataset=ds, batch_size=batch_size, num_workers=2, stateful=stateful))


def state_at(files: list[str], batch_size: int, k: int) -> tuple[dict[str, Any], dict[str, Any], list[int]]:
    """The loader's position and stream state after ``k`` batches, and batch ``k + 1``'s ids (to check the resume)."""
    a = loader(files, batch_size)
    it = iter(a)
    for _ in range(k):
        next(it)
    order, stream = a.state_dict(), a.stream_state()
    assert stream is not None
    return order, stream, next(it)["id"].tolist()


def time_resume(files: list[str], batch_size: int, order: dict[str, Any], stream: dict[str, Any] | None) -> tuple:
    """Seconds from building the loader to its first batch after restoring ``order`` (and ``stream``), and its ids."""
    t0 = time.perf_counter()
    b = loader(files, batch_size, stateful=stream is not None)
    b.load_state_dict(order)
    b.load_stream_state(stream)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the replay's own warning
        first = next(iter(b))
    return time.perf_counter() - t0, first["id"].tolist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[10, 10_000])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--shards", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--replay", action="store_true", help="also time a resume that reads the stream again")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = write_shards(Path(tmp), (max(args.batches) + 100) * args.batch_size, args.shards)
        medians = {}
        for k in args.batches:
            order, stream, expected = state_at(files, args.batch_size, k)
            times = []
            for _ in range(args.repeats):
                seconds, got = time_resume(files, args.batch_size, order, stream)
                assert got == expected, (k, got, expected)  # the resumed stream goes on at batch k + 1
                times.append(seconds)
            medians[k] = statistics.median(times)
            line = f"resume at batch {k:>6}: first batch after {medians[k]:.3f} s (median of {args.repeats})"
            if args.replay:
                seconds, got = time_resume(files, args.batch_size, order, None)
                assert got == expected
                line += f"; by reading the stream again: {seconds:.3f} s"
            print(line, flush=True)
        lo, hi = min(medians.values()), max(medians.values())
        print(f"ratio slowest / fastest: {hi / lo:.2f} ({'within' if hi <= 2 * lo else 'NOT within'} 2x)")


if __name__ == "__main__":
    main()
