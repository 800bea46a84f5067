"""Per-step engine overhead: trainwright's Trainer (default hooks) vs a hand-written loop.

Both sides train the same model from the same initial weights on the same data with the
same optimizer; rounds alternate (raw, trainwright | trainwright, raw | ...) so machine noise hits both
alike; we report the median time of each side and their ratio, the median over rounds of
each round's ratio ("paired": the two runs of a round are adjacent in time, so slow drifts of
a shared machine cancel in it; the targets are checked on this one), the engine cost per step
in microseconds, and check that both end with the same final loss.

Workloads:
  A  MLP 32→64→10, batch 32, 2,000 SGD steps            (overhead-bound; target ≤ 1.05×)
  B  MLP 512→2048→2048→10, batch 256, 300 SGD steps      (compute-bound; target ≤ 1.01×)
  C  A with accumulation 4 + clip_grad_norm(1.0)         (target ≤ 1.05× a raw loop doing the same)
  E  deep MLP: 32→64, 20×(64→64), 64→10 (44 parameters), batch 32, 1,000 SGD steps
     (overhead-bound with many parameters: what the engine costs per parameter; target ≤ 1.05×)
  D  DDP on 2 gloo processes                             (its own script: benchmarks/ddp.py)

Also: import time of trainwright on top of torch, and peak RSS of each side (subprocesses).

Run:  python benchmarks/overhead.py [--rounds 15] [--only A,B,C,E] [--no-rss] [--steps N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

LOG_INTERVAL = 10  # the hand-written loop looks at its loss as often as trainwright's default logger


@dataclass
class Workload:
    name: str
    sizes: tuple[int, ...]
    batch: int
    steps: int
    accum: int = 1
    clip: float | None = None
    target: float = 1.05


WORKLOADS = {
    "A": Workload("A", (32, 64, 10), 32, 2000, target=1.05),
    "B": Workload("B", (512, 2048, 2048, 10), 256, 300, target=1.01),
    "C": Workload("C", (32, 64, 10), 32, 2000, accum=4, clip=1.0, target=1.05),
    "E": Workload("E", (32, *([64] * 21), 10), 32, 1000, target=1.05),
}


def make_mlp(sizes: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def make_data(w: Workload) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    n = w.batch * w.steps
    x = torch.randn(n, w.sizes[0], generator=g)
    y = torch.randint(0, w.sizes[-1], (n,), generator=g)
    return TensorDataset(x, y)


def raw_loop(w: Workload, init: dict, data: TensorDataset, work_dir: str) -> tuple[float, float, float]:
    """The hand-written loop: what a user would write without a framework (log every 10, save at the end)."""
    t_start = time.perf_counter()
    torch.manual_seed(0)
    model = make_mlp(w.sizes)
    model.load_state_dict(init)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(data, batch_size=w.batch, shuffle=False)
    t0 = time.perf_counter()
    model.train()
    last = 0.0
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        if w.accum == 1:
            loss.backward()
            opt.step()
            opt.zero_grad()
        else:
            (loss / w.accum).backward()
            if (i + 1) % w.accum == 0:
                if w.clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), w.clip)
                opt.step()
                opt.zero_grad()
        if (i + 1) % LOG_INTERVAL == 0:
            last = loss.item()
            print(f"iter {i + 1} loss {last:.4f}")
    last = loss.item()
    t1 = time.perf_counter()
    os.makedirs(work_dir, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, os.path.join(work_dir, "last.pth"))
    return t1 - t0, time.perf_counter() - t_start, last


def stopwatch():
    """A hook bracketing the training iterations (before_train .. after_train_epoch).

    It overrides no per-iteration event, so it costs nothing per step. Its priority (LOW)
    puts its ``after_train_epoch`` after the logger's, which writes the epoch's last held
    log lines, and before the checkpoint hook's save: at the stop both sides have written
    every log line of the epoch and saved nothing (the hand-written loop prints inside its
    timed loop and saves after it).
    """
    import trainwright as tw

    class Stopwatch(tw.Hook):
        priority = "LOW"

        def before_train(self, trainer) -> None:
            self.t0 = time.perf_counter()

        def after_train_epoch(self, trainer) -> None:
            self.t1 = time.perf_counter()

    return Stopwatch()


def trainwright_loop(w: Workload, init: dict, data: TensorDataset, work_dir: str) -> tuple[float, float, float]:
    """The same training through trainwright's Trainer with its default hooks.

    Returns (time of the training iterations, end-to-end time of train() including setup and
    the final checkpoint, final loss).
    """
    import trainwright as tw

    class Net(tw.BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = make_mlp(w.sizes)

        def forward(self, x, y=None, mode="tensor"):
            out = self.mlp(x)
            return {"loss": F.cross_entropy(out, y)} if mode == "loss" else out

    watch = stopwatch()
    torch.manual_seed(0)
    net = Net()
    net.mlp.load_state_dict(init)
    optim = dict(optimizer=dict(type="SGD", lr=0.01, momentum=0.9), accumulative_counts=w.accum)
    if w.clip is not None:
        optim["clip_grad"] = dict(max_norm=w.clip)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = tw.Trainer(
            model=net,
            work_dir=work_dir,
            train_dataloader=DataLoader(data, batch_size=w.batch, shuffle=False),
            optim_wrapper=optim,
            train_cfg=dict(by_epoch=True, max_epochs=1),
            randomness=dict(seed=0),
            custom_hooks=[watch],
        )
        t0 = time.perf_counter()
        trainer.train()
        elapsed = time.perf_counter() - t0
    trainer.close()
    last = trainer.metric_store.get("loss").latest
    return watch.t1 - watch.t0, elapsed, last


def bench(w: Workload, rounds: int) -> dict:
    torch.manual_seed(0)
    init = make_mlp(w.sizes).state_dict()
    data = make_data(w)
    raw_t, tw_t, raw_e2e, tw_e2e = [], [], [], []
    raw_loss = tw_loss = float("nan")
    sink = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sink):
        raw_loop(w, init, data, os.path.join(tmp, "raw"))  # warm-up both paths (allocator, kernels, imports)
        trainwright_loop(w, init, data, os.path.join(tmp, "warm"))
        for r in range(rounds):
            # ABBA order: odd rounds run trainwright first, so a machine that drifts slower or
            # faster during a round does not always favour the same side.
            for side in ("raw", "tw") if r % 2 == 0 else ("tw", "raw"):
                if side == "raw":
                    t, e, raw_loss = raw_loop(w, init, data, os.path.join(tmp, "raw"))
                    raw_t.append(t)
                    raw_e2e.append(e)
                else:
                    t, e, tw_loss = trainwright_loop(w, init, data, os.path.join(tmp, f"r{r}"))
                    tw_t.append(t)
                    tw_e2e.append(e)
    raw_m, tw_m = statistics.median(raw_t), statistics.median(tw_t)
    ratios = sorted(b / a for a, b in zip(raw_t, tw_t))
    return {
        "workload": w.name,
        "steps": w.steps,
        "raw_s": raw_m,
        "trainwright_s": tw_m,
        "ratio": tw_m / raw_m,
        "ratio_paired_median": statistics.median(ratios),
        "us_per_step_raw": raw_m / w.steps * 1e6,
        "engine_us_per_step": (tw_m - raw_m) / w.steps * 1e6,
        "target": w.target,
        "end_to_end_ratio": statistics.median(tw_e2e) / statistics.median(raw_e2e),
        "raw_final_loss": raw_loss,
        "trainwright_final_loss": tw_loss,
        "same_final_loss": abs(raw_loss - tw_loss) <= 1e-5 * max(1.0, abs(raw_loss)),
    }


def import_time(reps: int = 7) -> dict:
    """Median wall time of `import torch` vs `import torch, trainwright` in fresh interpreters."""
    code = (
        "import time,sys;t=time.perf_counter();import "
        "torch;t1=time.perf_counter();{extra};print(time.perf_counter()-t1 if {tw} else t1-t)"
    )
    tw_times = []
    # as installed code runs: bytecode cached (PYTHONDONTWRITEBYTECODE=1 would compile every module at each import: ~0.4
    # s here)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for i in range(reps + 1):  # the first run writes the bytecode caches, untimed
        out = subprocess.run(
            [sys.executable, "-c", code.format(extra="import trainwright", tw=True)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        if i:
            tw_times.append(float(out.stdout.strip().splitlines()[-1]))
    return {"trainwright_import_s_on_top_of_torch": statistics.median(tw_times), "target_s": 0.3}


def peak_rss(workload: str) -> dict:
    """Peak RSS (MB) of a process running only the raw loop vs only trainwright on workload A."""
    out = {}
    for side in ("raw", "trainwright"):
        res = subprocess.run(
            [sys.executable, __file__, "--rss-child", side, "--only", workload],
            capture_output=True,
            text=True,
            check=True,
        )
        out[side] = float(res.stdout.strip().splitlines()[-1])
    out["delta_mb"] = out["trainwright"] - out["raw"]
    out["target_delta_mb"] = 30.0
    return out


def rss_child(side: str, name: str) -> None:
    import resource

    w = WORKLOADS[name]
    torch.manual_seed(0)
    init = make_mlp(w.sizes).state_dict()
    data = make_data(w)
    if side == "raw":
        with tempfile.TemporaryDirectory() as tmp:
            raw_loop(w, init, data, tmp)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            trainwright_loop(w, init, data, tmp)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description="trainwright per-step overhead vs a raw PyTorch loop")
    parser.add_argument(
        "--rounds",
        type=int,
        default=15,
        help="alternating rounds per workload; the medians need ~15 on a noisy machine",
    )
    parser.add_argument("--only", default="A,B,C,E")
    parser.add_argument("--no-rss", action="store_true")
    parser.add_argument(
        "--import-reps",
        type=int,
        default=7,
        help="fresh interpreters timed for the import time of trainwright (median)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--steps",
        type=int,
        default=0,
        help="steps per run of every workload (0: each workload's own; fewer for a quick check)",
    )
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for w in WORKLOADS.values():
        w.steps = args.steps or w.steps
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.rss_child:
        rss_child(args.rss_child, args.only)
        return
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, python "
        f"{sys.version.split()[0]}"
    )
    results = []
    print(
        f"{'wl':<3} {'steps':>5} {'raw s':>8} {'tw s':>8} {'ratio':>6} {'paired':>6} {'raw µs/step':>11} "
        f"{'engine µs/step':>14} {'target':>11} {'same loss':>9} {'e2e ratio':>9}"
    )
    for name in args.only.split(","):
        r = bench(WORKLOADS[name], args.rounds)
        results.append(r)
        ok = "OK" if r["ratio_paired_median"] <= r["target"] else "MISS"
        print(
            f"{r['workload']:<3} {r['steps']:>5} {r['raw_s']:>8.3f} {r['trainwright_s']:>8.3f} {r['ratio']:>6.3f} "
            f"{r['ratio_paired_median']:>6.3f} {r['us_per_step_raw']:>11.1f} {r['engine_us_per_step']:>14.1f} "
            f"{'≤' + format(r['target'], '.2f') + ' ' + ok:>11} {str(r['same_final_loss']):>9} "
            f"{r['end_to_end_ratio']:>9.3f}"
        )
    print("D   DDP on 2 gloo processes: python benchmarks/ddp.py (separate processes under torchrun)")
    extra: dict = {"import": import_time(max(1, args.import_reps))}
    print(
        f"import trainwright on top of torch: {extra['import']['trainwright_import_s_on_top_of_torch']:.3f} s (target "
        "≤ 0.3 s)"
    )
    if not args.no_rss:
        extra["rss_A"] = peak_rss("A")
        print(
            f"peak RSS workload A: raw {extra['rss_A']['raw']:.0f} MB, trainwright {extra['rss_A']['trainwright']:.0f} "
            f"MB, delta {extra['rss_A']['delta_mb']:+.0f} MB (target ≤ +30 MB)"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": results, **extra}, fh, indent=2)


if __name__ == "__main__":
    main()
