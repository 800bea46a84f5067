"""Start fast, stay lean: launch -> first step, import time, peak RSS and the blocking save, beside a hand-written loop.

Run:  python benchmarks/startup.py [--rounds 7] [--steps 10] [--dim 256] [--depth 4] [--threads 1] [--cli-reps 5]
          [--src OTHER_CHECKOUT/src] [--hooks '{"flops": null}'] [--json FILE]
      python benchmarks/startup.py --save-parts 15      # what a blocking save does beyond torch.save, in one process

Each round starts one fresh process per side, rotating which goes first (raw, trainwright |
trainwright, raw | ...). Both sides train the same small GPT (token + position embeddings,
``depth`` pre-norm blocks, AdamW, fp32, CPU) on the same random tokens for ``--steps``
iterations and save model + optimizer once, after the last step:

* **raw**: a careful hand-written loop (``loss.item()`` printed every 10 steps,
  ``torch.save({"model", "optimizer"}, path)``).
* **trainwright**: ``Trainer(...).train()`` with every default hook on (timer, logger to
  console + ``train.log`` + ``metrics.jsonl``, flops, param scheduler, checkpoint every
  ``--steps`` iterations, sampler seed, preemption, progress bar, stall watcher).

Per process: seconds from the parent's launch to the end of the first optimizer step
(interpreter start, imports, model, data, trainer setup, first step), ``import torch`` and
``import trainwright`` on top of it, the blocking save (raw: the ``torch.save`` call;
trainwright: the whole ``after_train_iter`` of the checkpoint hook at the saving iteration,
timed by two hooks of priority 89 and 100 around it: collect, check, atomic write (its
fsyncs run in a background thread), ``latest``, keep-k), and peak RSS (``ru_maxrss``). Bytecode is cached as in an
installed package (``PYTHONDONTWRITEBYTECODE`` is dropped for the children; one untimed
warm-up process per side writes the caches). Also ``trainwright --help`` and ``trainwright
env`` wall time. Medians and [min-max] are printed; the deltas are the medians of each
round's own difference (the two processes of a round are adjacent in time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_SRC: str | None = None  # --src: where the children import trainwright from
_FIXED_MMAP = False  # --fixed-mmap-threshold: glibc's mmap threshold fixed in both children
#: The command lines timed (python + these arguments): the CLI's answers, and torch's import for reference.
COMMANDS = {
    "trainwright --help": ["-m", "trainwright", "--help"],
    "trainwright env": ["-m", "trainwright", "env"],
    "trainwright env --full": ["-m", "trainwright", "env", "--full"],
    "python -c 'import torch'": ["-c", "import torch"],
}
TARGETS = {"first_step_delta_s": 0.25, "import_s": 0.2, "rss_delta_mb": 6.0, "save_ratio": 1.3, "cli_s": 1.0}


# --------------------------------------------------------------------------- one process (a side)


def _cpu_s() -> float:
    """CPU seconds this process has used (user + system, every thread): less sensitive to other jobs than wall time."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mb() -> float:
    """Peak RSS of this process so far, MB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(
    side: str, launched: float, work_dir: str, steps: int, dim: int, depth: int, threads: int, hooks: dict
) -> None:
    """Train one side and print one JSON line of its timings (run in a fresh interpreter)."""
    t_start = time.perf_counter()
    import torch

    t_torch = time.perf_counter()
    import torch._dynamo  # noqa: F401 - torch.optim's first optimizer imports it (~1.5 s here): both sides pay it, here rather than in "setup"
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    out: dict[str, float] = {"import_torch_s": t_torch - t_start}
    tw = None
    if side == "trainwright":
        t_tw = time.perf_counter()
        import trainwright as tw

        tw.Trainer, tw.Hook  # noqa: B018 - the names load on first use: count them in the import
        out["import_trainwright_s"] = time.perf_counter() - t_tw
    torch.set_num_threads(threads)
    rss: dict[str, float] = {"imported": _rss_mb()}  # peak RSS at each mark: where the peak is reached
    marks: dict[str, float] = {"imported": time.time()}
    cpu: dict[str, float] = {"imported": _cpu_s()}

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (z.view(b, t, 4, -1).transpose(1, 2) for z in self.qkv(self.ln1(x)).chunk(3, -1))
            x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, vocab: int = 96, block: int = 64) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, dim), nn.Parameter(torch.zeros(1, block, dim))
            self.blocks = nn.Sequential(*[Block() for _ in range(depth)])
            self.head = nn.Linear(dim, vocab)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = self.head(self.blocks(self.tok(x) + self.pos[:, : x.shape[1]]))
            return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    torch.manual_seed(0)
    model = GPT()
    tokens = torch.randint(0, 96, (16 * steps, 65), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=16)
    if side == "raw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for i, (x, y) in enumerate(loader, 1):
            if i == 1:
                marks["first_iter"], cpu["first_iter"] = time.time(), _cpu_s()
            loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if i == 1:
                marks["first_step"], cpu["first_step"], rss["first_step"] = time.time(), _cpu_s(), _rss_mb()
            if i % 10 == 0:
                print(f"iter {i} loss {loss.item():.4f}", file=sys.stderr)
        rss["before_save"] = _rss_mb()
        t0 = time.perf_counter()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, os.path.join(work_dir, "last.pth"))
        out["save_s"] = time.perf_counter() - t0
        out["final_loss"] = loss.item()
    else:
        assert tw is not None

        class Mark(tw.Hook):
            """Notes the first iteration's start and end (priority 0) or the time around the checkpoint hook (89 /
            100)."""

            def __init__(self, key: str, priority: int) -> None:
                self.key, self.priority = key, priority

            def before_train_iter(self, trainer, batch_idx, data_batch=None) -> None:  # type: ignore[no-untyped-def]
                if self.key == "first_step" and trainer.progress.iteration == 0:
                    marks["first_iter"], cpu["first_iter"] = time.time(), _cpu_s()

            def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None) -> None:  # type: ignore[no-untyped-def]
                it = trainer.progress.iteration
                if self.key == "first_step" and it == 1:
                    marks["first_step"], cpu["first_step"], rss["first_step"] = time.time(), _cpu_s(), _rss_mb()
                elif self.key != "first_step" and it == steps:
                    marks[self.key] = time.perf_counter()
                    if self.key == "save_start":
                        rss["before_save"] = _rss_mb()

        trainer = tw.Trainer(
            model=model,
            train_dataloader=loader,
            work_dir=work_dir,
            optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)),
            train_cfg=dict(by_epoch=False, max_iters=steps),
            default_hooks={"checkpoint": dict(by_epoch=False, interval=steps), **hooks},
            custom_hooks=[Mark("first_step", 0), Mark("save_start", 89), Mark("save_end", 100)],
        )
        trainer.train()
        out["save_s"] = marks["save_end"] - marks["save_start"]
    out["weights_sum"] = float(
        sum(p.detach().double().sum() for p in model.parameters())
    )  # both sides train the same weights
    out["first_step_s"] = marks["first_step"] - launched
    out["first_step_cpu_s"] = cpu["first_step"]  # CPU time from the interpreter's start to the first step's end
    out["imports_cpu_s"], out["setup_cpu_s"] = cpu["imported"], cpu["first_iter"] - cpu["imported"]
    out["first_iter_cpu_s"] = cpu["first_step"] - cpu["first_iter"]
    out["imports_s"] = marks["imported"] - launched  # interpreter start and every import
    out["setup_s"] = (
        marks["first_iter"] - marks["imported"]
    )  # model, data, optimizer (trainwright: Trainer() and train() up to the first iteration)
    out["first_iter_s"] = (
        marks["first_step"] - marks["first_iter"]
    )  # the first iteration (trainwright: its hooks included)
    out["peak_rss_mb"] = _rss_mb()
    out.update({f"rss_{k}_mb": v for k, v in rss.items()})
    print(json.dumps(out))


# --------------------------------------------------------------------------- the parts of a blocking save


def save_parts(rounds: int, dim: int, depth: int) -> None:
    """Time, in this process and alternating, what a synchronous trainwright save does beyond ``torch.save``.

    The state is the benchmark GPT's weights + AdamW state (same size, Linear stacks); every
    write goes to a new name (as periodic checkpoints do). Ratios are the medians of each
    round's own ratio to ``torch.save(state, path)``.
    """
    import pathlib
    import random

    import torch
    from torch import nn

    from trainwright.checkpoint.durability import wait_durable
    from trainwright.checkpoint.io import atomic_save
    from trainwright.checkpoint.listing import write_latest
    from trainwright.checkpoint.rng import get_rng_state
    from trainwright.checkpoint.stateful import make_safe

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(dim, 4 * dim) for _ in range(3 * depth)])
    opt = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": get_rng_state(),
        "python": random.getstate(),
    }
    with tempfile.TemporaryDirectory() as d:
        names = (os.path.join(d, f"c{i}.pth") for i in range(10**6))

        def no_fsync() -> None:  # temporary name + rename, without fsync: NOT crash-safe, for comparison only
            path = next(names)
            with open(path + ".tmp", "wb") as f:
                torch.save(state, f)
            os.replace(path + ".tmp", path)

        def atomic_and_latest() -> None:
            path = next(names)
            atomic_save(state, path, durable=False)
            write_latest(d, os.path.basename(path))

        from trainwright.checkpoint.manager import CheckpointManager
        from trainwright.strategies import SingleDeviceStrategy
        from trainwright.utils.progress import Progress

        manager = CheckpointManager(
            SingleDeviceStrategy(device="cpu"), {"model": model, "optimizer": opt}, d, progress=Progress()
        )
        saves = iter(range(10**6))

        parts = {
            "torch.save(state, path)": lambda: torch.save(state, next(names)),
            "CheckpointManager.save_periodic: collect, check, write, latest": lambda: manager.save_periodic(
                f"iter_{next(saves)}.pth"
            ),
            "temp + rename, no fsync": no_fsync,
            "atomic_save (temp, fsync, rename, dir fsync)": lambda: atomic_save(state, next(names)),
            "atomic_save(durable=False): fsyncs in background": lambda: atomic_save(state, next(names), durable=False),
            "that + latest (what a periodic save blocks for)": atomic_and_latest,
            "make_safe(state)": lambda: make_safe(state),
        }
        times: dict[str, list[float]] = {k: [] for k in parts}
        for r in range(rounds):
            for name in list(parts) if r % 2 == 0 else list(parts)[::-1]:
                t0 = time.perf_counter()
                parts[name]()
                times[name].append(time.perf_counter() - t0)
                wait_durable()  # untimed: the background fsyncs are done before the next part (saves are far apart)
                os.sync()  # untimed: every part starts with no dirty pages of the others, as a save long after the last
            for f in pathlib.Path(d).iterdir():
                f.unlink()
    base = times["torch.save(state, path)"]
    print(
        f"blocking-save parts, {rounds} alternating rounds, "
        f"{sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3 / 2**20:.0f} MiB of tensors; "
        "median [min-max]"
    )
    for name, xs in times.items():
        ratio = statistics.median(x / b for x, b in zip(xs, base))
        print(f"  {name:<52} {_fmt(xs, ' ms', 1e3, 1)}   x{ratio:.2f} of torch.save")


# --------------------------------------------------------------------------- the parent


def _env() -> dict[str, str]:
    """The children's environment: bytecode cached, as installed code runs."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if _FIXED_MMAP:  # large blocks (activations) always mmapped: no heap fragmentation in the peak
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    if _SRC:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC, env.get("PYTHONPATH")) if p)
    return env


def run_side(side: str, args: argparse.Namespace) -> dict[str, float]:
    """One fresh process of ``side``; its JSON line."""
    with tempfile.TemporaryDirectory() as work_dir:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            side,
            "--work-dir",
            work_dir,
            "--steps",
            str(args.steps),
            "--dim",
            str(args.dim),
            "--depth",
            str(args.depth),
            "--threads",
            str(args.threads),
            "--hooks",
            args.hooks,
        ]
        launched = time.time()
        res = subprocess.run(
            [*cmd, "--launched", repr(launched)], capture_output=True, text=True, env=_env(), timeout=600
        )
        if res.returncode != 0:
            raise RuntimeError(f"{side} child failed ({res.returncode}):\n{res.stderr[-3000:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def cli_time(argv: list[str], reps: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``python <argv>`` in fresh interpreters (after one untimed run)."""
    import resource

    times, cpu = [], []
    for i in range(reps + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=_env(), timeout=120, check=True)
        wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        if i:
            times.append(wall)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return times, cpu


def _fmt(xs: list[float], unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    xs = [x * scale for x in xs]
    return f"{statistics.median(xs):.{digits}f}{unit} [{min(xs):.{digits}f}-{max(xs):.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds of one process per side (order rotates)")
    parser.add_argument(
        "--steps", type=int, default=10, help="training iterations per process; the checkpoint follows the last"
    )
    parser.add_argument(
        "--dim",
        type=int,
        default=256,
        help="the GPT's width (256, depth 4: 3.2M parameters, a 38 MB checkpoint with AdamW)",
    )
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads of each side (1: steadier on a shared machine)"
    )
    parser.add_argument(
        "--src",
        default=None,
        help="import trainwright from this folder (another checkout's src/), e.g. to time the previous release",
    )
    parser.add_argument(
        "--cli-reps", type=int, default=5, help="fresh processes timed for `trainwright --help` / `env` (0: skip)"
    )
    parser.add_argument(
        "--hooks",
        default="{}",
        help="JSON merged into trainwright's default_hooks, to see what one costs (e.g. '{\"flops\": null}')",
    )
    parser.add_argument(
        "--warmups", type=int, default=1, help="untimed processes per side first (they write the bytecode caches)"
    )
    parser.add_argument(
        "--fixed-mmap-threshold",
        action="store_true",
        help="run both children with glibc's mmap threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_): the peak RSS "
        "then leaves out how the heap fragments around the activations, which moves each process's peak by several MB",
    )
    parser.add_argument("--json", default=None, help="also write every number to this file")
    parser.add_argument(
        "--save-parts",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only time the parts of a blocking save in this process (ROUNDS alternating rounds)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(
            args.child,
            args.launched,
            args.work_dir,
            args.steps,
            args.dim,
            args.depth,
            args.threads,
            json.loads(args.hooks),
        )
        return

    if args.save_parts:
        save_parts(args.save_parts, args.dim, args.depth)
        return
    global _SRC, _FIXED_MMAP
    _SRC = os.path.abspath(args.src) if args.src else None
    _FIXED_MMAP = args.fixed_mmap_threshold
    sides = ("raw", "trainwright")
    if args.rounds <= 0:  # only the command line
        for name, argv in COMMANDS.items():
            load = os.getloadavg()[0]
            times, cpu = cli_time(argv, max(1, args.cli_reps))
            print(f"{name:<29} {_fmt(times, ' s')}, CPU {_fmt(cpu, ' s')}   (load average {load:.1f})")
        return
    for _ in range(args.warmups):  # untimed: writes the bytecode caches, warms the page cache
        for side in sides:
            run_side(side, args)
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    loads: list[float] = []  # the 1-minute load average at each round's start: how busy the machine was
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for side in sides if r % 2 == 0 else sides[::-1]:
            runs[side].append(run_side(side, args))
            print(
                f"round {r + 1} {side}: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[side][-1].items()),
                file=sys.stderr,
            )

    def col(side: str, key: str) -> list[float]:
        return [run[key] for run in runs[side]]

    def delta(key: str) -> list[float]:
        return [t[key] - r[key] for r, t in zip(runs["raw"], runs["trainwright"])]

    paired = {
        k: delta(k)
        for k in (
            "first_step_s",
            "first_step_cpu_s",
            "imports_s",
            "setup_s",
            "first_iter_s",
            "imports_cpu_s",
            "setup_cpu_s",
            "first_iter_cpu_s",
            "peak_rss_mb",
        )
    }
    paired["save_ratio"] = [t["save_s"] / r["save_s"] for r, t in zip(runs["raw"], runs["trainwright"])]
    print(
        f"{args.rounds} rounds, {args.steps} steps, GPT dim {args.dim} depth {args.depth}, {args.threads} thread(s), "
        f"trainwright from {_SRC or 'the installed package'}; median [min-max]"
        + ("; glibc mmap threshold fixed at 128 KiB" if _FIXED_MMAP else "")
    )
    print(f"load average (1 min) at the rounds' starts: {_fmt(loads, digits=1)} on {os.cpu_count()} CPUs")
    print(
        f"import torch:                 raw {_fmt(col('raw', 'import_torch_s'), ' s')}   trainwright "
        f"{_fmt(col('trainwright', 'import_torch_s'), ' s')}"
    )
    print(
        f"import trainwright on torch:  {_fmt(col('trainwright', 'import_trainwright_s'), ' s')}   (target <= "
        f"{TARGETS['import_s']} s; with tw.Trainer, tw.Hook)"
    )
    print(
        "phase (wall s; CPU s)         raw                    trainwright            trainwright - raw, paired (wall; "
        "CPU)"
    )
    for key, what in (
        ("imports", "launch -> imports done"),
        ("setup", "setup -> 1st iteration"),
        ("first_iter", "first iteration"),
        ("first_step", "launch -> 1st step done"),
    ):
        print(
            f"{what:<30}{_fmt(col('raw', key + '_s'))}  {_fmt(col('trainwright', key + '_s'))}  "
            f"{_fmt(paired[key + '_s'])}; {_fmt(paired[key + '_cpu_s'])}"
        )
    print(f"  target: trainwright's first step <= {TARGETS['first_step_delta_s']} s after the raw loop's")
    print(
        f"peak RSS:                     raw {_fmt(col('raw', 'peak_rss_mb'), ' MB', digits=1)}   trainwright "
        f"{_fmt(col('trainwright', 'peak_rss_mb'), ' MB', digits=1)}"
    )
    print(
        f"  trainwright - raw (paired): {_fmt(paired['peak_rss_mb'], ' MB', digits=1)}   (target <= "
        f"{TARGETS['rss_delta_mb']} MB)"
    )
    print(
        f"blocking save:                raw torch.save {_fmt(col('raw', 'save_s'), ' ms', 1e3, 1)}   trainwright "
        f"{_fmt(col('trainwright', 'save_s'), ' ms', 1e3, 1)}"
    )
    print(
        f"  trainwright / raw (paired): {_fmt(paired['save_ratio'], 'x', digits=2)}   (target <= "
        f"{TARGETS['save_ratio']}x)"
    )
    same = all(r["weights_sum"] == t["weights_sum"] for r, t in zip(runs["raw"], runs["trainwright"]))
    print(f"same final weights on both sides in every round: {'yes' if same else 'NO'}")
    result: dict = {"args": vars(args), "runs": runs, "paired": paired, "load_average": loads}
    if args.cli_reps > 0:
        for name, argv in COMMANDS.items():
            times, cpu = cli_time(argv, args.cli_reps)
            result[name] = {"wall_s": times, "cpu_s": cpu}
            print(f"{name:<29} {_fmt(times, ' s')}, CPU {_fmt(cpu, ' s')}   (CLI target < {TARGETS['cli_s']} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
