"""The GPT example's model trained by trainwright and by a hand-written loop, eager and compiled.

Both sides train examples/char_gpt.py's ``CharGPT`` (imported from the example) from the same
initial weights on the same windows of its text (``PythonHelpText``), with AdamW and
``clip_grad_norm_(1.0)``, the same precision (autocast, and a GradScaler for ``16-mixed``),
logging the loss every 10 iterations. Each round runs every side once, in alternating order
(as benchmarks/overhead.py does); the first ``--warmup`` steps of every run are not timed (a
compiled step's first calls compile or check their guards). Reported per row: the medians,
their ratio, the median of the per-round ratios ("paired"; the targets are checked on it),
tokens per second, whether the final losses agree, and the paired ratio of process CPU time
("cpu paired": less sensitive than wall time to other processes on a shared machine). The compiled sides are timed once
more for their compile time: the
first run of the process (its first steps compile) minus a steady run's time for the same steps.

Rows:
  eager      trainwright eager                                        vs hand-written eager
  compiled   trainwright compile=dict(regions=["Block"]) + compiled optimizer step
                                                                      vs the hand-written loop compiled the same way
  vs eager   the same trainwright compiled run                        vs hand-written eager
  blocks     trainwright compile=dict(regions=["Block"]), eager optimizer step
                                                                      vs the hand-written loop compiled the same way
             (sides tw_blocks / raw_blocks, not run by default: they tell the blocks' share from the optimizer's)

Run:  python benchmarks/gpt.py                                   # CPU, small model, ~3 minutes
      python benchmarks/gpt.py --device cuda --preset gpt2-small --precision bf16-mixed --steps 30
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from char_gpt import CharGPT, PythonHelpText  # noqa: E402  (the example's model and data, not a copy)
from overhead import LOG_INTERVAL  # noqa: E402  (the hand-written loop reads its loss as often as trainwright's logger)

PRESETS = {"gpt2-small": dict(dim=768, depth=12, heads=12, block_size=1024)}
OPTIMIZER = dict(lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98))  # the example's AdamW
CLIP = 1.0


@dataclass
class Setup:
    device: str
    precision: str
    dim: int
    depth: int
    heads: int
    block_size: int
    batch_size: int
    steps: int
    warmup: int
    # torch.compile's backend for the compiled sides ("aot_eager": no code generation, for a quick check)
    backend: str = "inductor"


def make_data(s: Setup) -> Subset:
    """``steps * batch_size`` windows of the example's training text (overlapping when the text is short)."""
    need = s.steps * s.batch_size
    text_len = len(PythonHelpText("train", block_size=1, stride=10**9).data)
    stride = max(1, min(s.block_size, (text_len - s.block_size - 2) // need))
    ds = PythonHelpText("train", block_size=s.block_size, stride=stride)
    if len(ds) < need:
        raise SystemExit(
            f"the example's text holds {len(ds)} windows of {s.block_size} characters, fewer than --steps x "
            f"--batch-size = {need}"
        )
    return Subset(ds, range(need))


def make_model(s: Setup) -> CharGPT:
    return CharGPT(block_size=s.block_size, dim=s.dim, depth=s.depth, heads=s.heads)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _autocast(s: Setup) -> Any:
    if s.precision in ("bf16-mixed", "float8"):
        return torch.autocast(torch.device(s.device).type, dtype=torch.bfloat16)
    if s.precision == "16-mixed":
        return torch.autocast(torch.device(s.device).type, dtype=torch.float16)
    return contextlib.nullcontext()


def _compile_step(opt: torch.optim.Optimizer, backend: str) -> Any:
    """torch's compiled-optimizer recipe for a hand-written loop: the lr as a tensor, the step compiled."""
    for g in opt.param_groups:
        g["lr"] = torch.tensor(float(g["lr"]), dtype=torch.float64)
    return torch.compile(opt.step, backend=backend)


def raw_loop(
    s: Setup, init: dict, data: Subset, compiled: bool, compile_step: bool = True
) -> tuple[float, float, float, float]:
    """The hand-written loop; returns (time of the steps after warm-up, time of all steps, final loss, CPU time of the
    steps after warm-up).

    ``compiled``: each Block compiled, and the optimizer step too unless ``compile_step`` is False.
    """
    torch.manual_seed(0)
    model = make_model(s)
    model.load_state_dict(init)
    model.to(s.device)
    if s.precision == "float8":
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model)
    if compiled:
        for block in model.blocks:
            block.compile(backend=s.backend)
    opt = torch.optim.AdamW(model.parameters(), **OPTIMIZER)
    if compiled and compile_step:
        opt.step = _compile_step(opt, s.backend)  # type: ignore[method-assign]  # what GradScaler.step calls, too
    step = opt.step
    scaler = torch.amp.GradScaler(torch.device(s.device).type) if s.precision == "16-mixed" else None
    loader = DataLoader(data, batch_size=s.batch_size, shuffle=False, drop_last=True)
    model.train()
    _sync(s.device)
    t_start = t0 = time.perf_counter()
    c0 = time.process_time()
    for i, (x, y) in enumerate(loader):
        x, y = x.to(s.device, non_blocking=True), y.to(s.device, non_blocking=True)
        with _autocast(s):
            loss = model(x, y, mode="loss")["loss"]
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            scaler.step(opt)  # calls opt.step: the compiled step when compiled
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            step()
        opt.zero_grad()
        if (i + 1) % LOG_INTERVAL == 0:
            print(f"iter {i + 1} loss {loss.item():.4f}")
        if i + 1 == s.warmup:
            _sync(s.device)
            t0, c0 = time.perf_counter(), time.process_time()
    last = loss.item()
    t1 = time.perf_counter()
    return t1 - t0, t1 - t_start, last, time.process_time() - c0


def trainwright_loop(
    s: Setup, init: dict, data: Subset, compiled: bool, work_dir: str, compile_step: bool = True
) -> tuple[float, float, float, float]:
    """The same training through trainwright's Trainer (default hooks); returns what :func:`raw_loop` returns."""
    import trainwright as tw

    class Stopwatch(tw.Hook):
        """Times the steps after warm-up and all steps (LOW: its epoch end runs after the logger's last lines, before
        checkpoints)."""

        priority = "LOW"

        def before_train(self, trainer: Any) -> None:
            _sync(s.device)
            self.t_start = self.t0 = time.perf_counter()
            self.c0 = time.process_time()

        def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
            if trainer.progress.iteration == s.warmup:
                _sync(s.device)
                self.t0, self.c0 = time.perf_counter(), time.process_time()

        def after_train_epoch(self, trainer: Any) -> None:
            _sync(s.device)
            self.t1, self.c1 = time.perf_counter(), time.process_time()

    torch.manual_seed(0)
    model = make_model(s)
    model.load_state_dict(init)
    watch = Stopwatch()
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = tw.Trainer(
            model=model,
            work_dir=work_dir,
            train_dataloader=DataLoader(data, batch_size=s.batch_size, shuffle=False, drop_last=True),
            optim_wrapper=dict(
                optimizer=dict(type="AdamW", **OPTIMIZER),
                clip_grad=dict(max_norm=CLIP),
                compile=dict(backend=s.backend) if compiled and compile_step else False,
            ),
            train_cfg=dict(by_epoch=True, max_epochs=1),
            precision=s.precision,
            strategy=dict(type="single", device=s.device),
            compile=dict(regions=["Block"], backend=s.backend) if compiled else False,
            default_hooks=dict(checkpoint=None),
            randomness=dict(seed=0),
            custom_hooks=[watch],
            log_level="WARNING",
        )
        trainer.train()
    trainer.close()
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r.get("mode") == "train"][-1]
    LOGGED[("tw_compiled" if compile_step else "tw_blocks") if compiled else "tw_eager"] = {
        k: last[k] for k in ("tflops", "mfu", "tokens_per_s") if k in last
    }
    return watch.t1 - watch.t0, watch.t1 - watch.t_start, trainer.metric_store.get("loss").latest, watch.c1 - watch.c0


#: What trainwright logged in the last line of each side's last run (``tflops``, ``mfu``: the FlopsHook's).
LOGGED: dict[str, dict[str, float]] = {}


#: side -> (loop, blocks compiled, optimizer step compiled)
SIDES = {
    "raw_eager": (raw_loop, False, False),
    "tw_eager": (trainwright_loop, False, False),
    "raw_compiled": (raw_loop, True, True),
    "tw_compiled": (trainwright_loop, True, True),
    "raw_blocks": (raw_loop, True, False),
    "tw_blocks": (trainwright_loop, True, False),
}
DEFAULT_SIDES = "raw_eager,tw_eager,raw_compiled,tw_compiled"
ROWS = [
    ("eager", "tw_eager", "raw_eager", 1.02),
    ("compiled", "tw_compiled", "raw_compiled", 1.02),
    ("vs eager", "tw_compiled", "raw_eager", 1.0),
    ("blocks", "tw_blocks", "raw_blocks", 1.02),
]


def run_side(name: str, s: Setup, init: dict, data: Subset, tmp: str, r: int) -> tuple[float, float, float, float]:
    fn, compiled, compile_step = SIDES[name]
    if fn is raw_loop:
        return raw_loop(s, init, data, compiled, compile_step)
    return trainwright_loop(s, init, data, compiled, os.path.join(tmp, f"{name}{r}"), compile_step)


def _progress(line: str) -> None:
    """One line per finished run on stderr (stdout is captured while the sides run): a run cut off by a time limit
    still shows how far it got."""
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def bench(s: Setup, rounds: int, sides: list[str]) -> dict:
    torch.manual_seed(0)
    init = make_model(s).state_dict()
    data = make_data(s)
    times: dict[str, list[float]] = {k: [] for k in sides}
    cpu: dict[str, list[float]] = {k: [] for k in sides}
    losses: dict[str, float] = {}
    sink = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sink):
        first: dict[str, float] = {}
        totals: dict[str, list[float]] = {k: [] for k in sides}
        for name in sorted(
            sides, key=lambda n: n != "tw_compiled"
        ):  # warm-up run of each side: the compiled ones compile here
            if SIDES[name][1]:
                # each compiled side compiles from scratch (the on-disk cache of this run is shared)
                torch._dynamo.reset()
            _, first[name], _, _ = run_side(name, s, init, data, tmp, -1)
            _progress(f"{name} first run {first[name]:.1f} s")
        for r in range(rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for name in order:
                t, total, losses[name], c = run_side(name, s, init, data, tmp, r)
                times[name].append(t)
                totals[name].append(total)
                cpu[name].append(c)
                _progress(f"round {r + 1} {name} {t:.3f} s timed")
        compile_s = {name: first[name] - statistics.median(totals[name]) for name in sides if SIDES[name][1]}
    timed_tokens = (s.steps - s.warmup) * s.batch_size * s.block_size
    tol = 1e-4 if s.precision == "32" else 2e-2
    rows = []
    for row, a, b, target in ROWS:
        if a not in times or b not in times:
            continue
        ma, mb = statistics.median(times[a]), statistics.median(times[b])
        paired = statistics.median(x / y for x, y in zip(times[a], times[b]))
        paired_cpu = statistics.median(x / y for x, y in zip(cpu[a], cpu[b]))
        rows.append(
            {
                "row": row,
                "trainwright": a,
                "reference": b,
                "trainwright_s": ma,
                "reference_s": mb,
                "ratio": ma / mb,
                "ratio_paired_median": paired,
                "cpu_ratio_paired_median": paired_cpu,
                "target": target,
                "tokens_per_s_trainwright": timed_tokens / ma,
                "tokens_per_s_reference": timed_tokens / mb,
                "final_loss_trainwright": losses[a],
                "final_loss_reference": losses[b],
                "same_final_loss": abs(losses[a] - losses[b]) <= tol * max(1.0, abs(losses[b])),
            }
        )
    return {
        "setup": asdict(s),
        "rounds": rounds,
        "rows": rows,
        "compile_s": compile_s,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "logged": LOGGED,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description="trainwright vs a hand-written loop on the GPT example's model, eager and compiled"
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="32", choices=["32", "bf16-mixed", "16-mixed", "float8"])
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="gpt2-small: dim 768, depth 12, heads 12, block 1024 (for a GPU)"
    )
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--steps", type=int, default=30, help="steps per run (one epoch over steps x batch-size windows)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="first steps of each run left out of its time")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternating rounds (each compiled run recompiles its new optimizer's step, ~5 s here); more on a noisy "
        "machine",
    )
    parser.add_argument("--sides", default=DEFAULT_SIDES, help=f"which of {','.join(SIDES)} to run")
    parser.add_argument(
        "--backend",
        default="inductor",
        help="torch.compile backend of the compiled sides (aot_eager: a quick check without code generation)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = dict(dim=args.dim, depth=args.depth, heads=args.heads, block_size=args.block_size)
    if args.preset:
        shape.update(PRESETS[args.preset])
    if args.warmup >= args.steps:
        parser.error("--warmup must be smaller than --steps")
    # cold compile times: a fresh inductor cache for this run (unless one is given)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="gpt_bench_inductor_"))
    # every run builds a new optimizer, and a compiled optimizer step is specialised to its optimizer object:
    # allow one compiled entry per run, as a process that trains once never needs
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * (args.rounds + 2))
    s = Setup(
        device=args.device,
        precision=args.precision,
        steps=args.steps,
        warmup=args.warmup,
        batch_size=args.batch_size,
        backend=args.backend,
        **shape,
    )
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, device {s.device}, "
        f"precision {s.precision}, "
        f"dim {s.dim} depth {s.depth} heads {s.heads} block {s.block_size} batch {s.batch_size}, {s.steps} steps "
        f"({s.warmup} untimed), {args.rounds} rounds"
    )
    result = bench(s, args.rounds, args.sides.split(","))
    print(
        f"{'row':<9} {'trainwright':<12} {'reference':<13} {'tw s':>7} {'ref s':>7} {'ratio':>6} {'paired':>6} "
        f"{'tw tok/s':>9} {'target':>11} {'same loss':>9} {'cpu paired':>10}"
    )
    for r in result["rows"]:
        ok = "OK" if r["ratio_paired_median"] <= r["target"] else "MISS"
        print(
            f"{r['row']:<9} {r['trainwright']:<12} {r['reference']:<13} {r['trainwright_s']:>7.3f} "
            f"{r['reference_s']:>7.3f} {r['ratio']:>6.3f} "
            f"{r['ratio_paired_median']:>6.3f} {r['tokens_per_s_trainwright']:>9.0f} "
            f"{'≤' + format(r['target'], '.2f') + ' ' + ok:>11} {str(r['same_final_loss']):>9} "
            f"{r['cpu_ratio_paired_median']:>10.3f}"
        )
    for name, logged in result["logged"].items():
        print(f"{name} logged: " + ", ".join(f"{k} {v:.4g}" for k, v in logged.items()))
    for name, c in result["compile_s"].items():
        print(f"compile time {name}: {c:.1f} s (first run of the process minus the median of its timed runs)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
