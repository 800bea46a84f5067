"""What hook timing and the progress bar cost per step.

1. One hook call, plain bound method vs through :meth:`HookTimer.wrap` (ns per call, best of
   alternating repeats).
2. Workload A (overhead.py) through the Trainer with its default hooks, ``hook_timing=True``
   vs ``False``, in alternating (ABBA) rounds: µs per step of each (median) and the paired
   difference; the same with one extra hook called at every iteration (``+every-iter hook``).
3. The progress bar: how many hook calls it takes per training iteration (from the hook
   report: none), and what one redraw costs on rich's thread (ms; it holds the interpreter
   that long, ``refresh_per_second`` times a second), so its share of a training thread's
   time is ``redraw × refresh_per_second``.

4. ``--instr``: instruction counts under valgrind's callgrind (immune to a busy machine) of
   one hook call plain / timed and of one bar redraw; the spans are marked by calls of
   ``time.thread_time_ns`` (``--dump-before``). The modules are loaded by path without
   torch, so this takes seconds; per step, multiply by the timed calls per step.

Run:  python benchmarks/ui_overhead.py [--rounds 11] [--threads 1] [--instr]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import overhead as ov  # noqa: E402
from overhead_breakdown import Net, W  # noqa: E402  (workload A's model, as the breakdown times it)

import trainwright as tw  # noqa: E402
from trainwright.hooks.timing import HookTimer  # noqa: E402


class EveryIter(tw.Hook):
    """A user hook with work at every iteration (a counter)."""

    def __init__(self) -> None:
        self.n = 0

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        self.n += 1


def call_cost(repeats: int = 9, number: int = 200_000) -> tuple[float, float]:
    """ns per call of a hook's after_train_iter: plain, timed (best of alternating repeats)."""
    hook = EveryIter()
    plain = hook.after_train_iter
    timed = HookTimer().wrap(hook, "after_train_iter", plain)
    best = {"plain": float("inf"), "timed": float("inf")}
    for _ in range(repeats):
        for name, fn in (("plain", plain), ("timed", timed)):
            calls = (fn,)

            def loop(calls=calls):
                for f in calls:
                    f(None, 0, None, None)

            best[name] = min(best[name], min(timeit.repeat(loop, number=number, repeat=1)) / number * 1e9)
    return best["plain"], best["timed"]


def trainer_run(timing: bool, extra: bool, init: dict, data, work_dir: str) -> float:
    watch = ov.stopwatch()
    net = Net()
    net.mlp.load_state_dict(init)
    hooks = [watch] + ([EveryIter()] if extra else [])
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = tw.Trainer(
            model=net,
            work_dir=work_dir,
            train_dataloader=DataLoader(data, batch_size=W.batch),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01, momentum=0.9)),
            train_cfg=dict(by_epoch=True, max_epochs=1),
            custom_hooks=hooks,
            randomness=dict(seed=0),
            hook_timing=timing,
        )
        trainer.train()
    trainer.close()
    return watch.t1 - watch.t0


def trainer_cost(rounds: int, extra: bool) -> tuple[float, float, float]:
    """µs per step with timing off / on (medians) and the median paired difference."""
    torch.manual_seed(0)
    init = ov.make_mlp(W.sizes).state_dict()
    data = ov.make_data(W)
    off, on, diff = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        trainer_run(True, extra, init, data, tmp)  # warm-up
        for r in range(rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {t: trainer_run(t, extra, init, data, tmp) / W.steps * 1e6 for t in order}
            off.append(got[False])
            on.append(got[True])
            diff.append(got[True] - got[False])
    return statistics.median(off), statistics.median(on), statistics.median(diff)


def bar_costs(repeats: int = 50) -> tuple[int, float]:
    """(hook calls per training iteration by the bar, ms per redraw of a train + val bar)."""
    from trainwright.hooks.rich_bar import LiveBar

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        trainer = tw.Trainer(
            model=Net(),
            work_dir=tmp,
            train_dataloader=DataLoader(ov.make_data(W), batch_size=W.batch),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
            train_cfg=dict(by_epoch=False, max_iters=200),
            default_hooks=dict(checkpoint=None, progress_bar=dict(enable=True)),
        )
        trainer.train()
        per_iter = sum(
            r.calls for r in trainer.hooks.report() if r.hook == "ProgressBarHook" and r.event.endswith("_train_iter")
        )
        trainer.close()
    term = io.StringIO()
    term.isatty = lambda: True  # type: ignore[method-assign]
    bar = LiveBar(term, refresh_per_second=2, force=True)
    n = [0]
    bar.add_source(lambda: (n[0], "train epoch 1/10"), 10_000)
    bar.add_source(lambda: (n[0] // 3, "val"), 500)
    bar.set_stats(0, "loss 0.1234  lr 1.00e-02")
    console = bar.console
    times = []
    for _ in range(repeats):
        n[0] += 37
        t = time.perf_counter()
        with console.capture():
            console.print(bar.render())  # what a redraw renders
        times.append(time.perf_counter() - t)
    return per_iter, statistics.median(times) * 1e3


INSTR_CALLS = 20_000
SRC = Path(__file__).resolve().parents[1] / "src" / "trainwright"


def _load(name: str, path: Path):
    """A trainwright module by path, without importing the package (and torch): callgrind then runs in seconds."""
    import importlib.util
    import types

    if "trainwright.hooks.hook" not in sys.modules:  # timing.py needs only Hook and EVENTS from it
        stub = types.ModuleType("trainwright.hooks.hook")
        stub.EVENTS = ("after_train_iter",)  # type: ignore[attr-defined]
        stub.Hook = type("Hook", (), {"state_key": "Hook"})  # type: ignore[attr-defined]
        sys.modules["trainwright.hooks.hook"] = stub
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def instr_child() -> None:
    """Parts between time.thread_time_ns() marks: INSTR_CALLS plain calls | INSTR_CALLS timed calls | 20 bar redraws."""
    timing = _load("ui_timing", SRC / "hooks" / "timing.py")
    rich_bar = _load("ui_rich_bar", SRC / "hooks" / "rich_bar.py")

    class H:
        n = 0

        def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
            self.n += 1

    h = H()
    plain = h.after_train_iter
    timed = timing.HookTimer().wrap(h, "after_train_iter", plain)
    term = io.StringIO()
    bar = rich_bar.LiveBar(term, refresh_per_second=2, force=True)
    n = [0]
    bar.add_source(lambda: (n[0], "train epoch 1/10"), 10_000)
    bar.add_source(lambda: (n[0] // 3, "val"), 500)
    bar.set_stats(0, "loss 0.1234  lr 1.00e-02")
    with bar.console.capture():
        bar.console.print(bar.render())  # warm caches
    for fns in ((plain,), (timed,)):
        time.thread_time_ns()
        for _ in range(INSTR_CALLS):
            for fn in fns:
                fn(None, 0, None, None)
    time.thread_time_ns()
    for _ in range(20):
        n[0] += 37
        with bar.console.capture():
            bar.console.print(bar.render())
    time.thread_time_ns()


def instr_counts() -> tuple[float, float, float]:
    """(instructions per plain call, per timed call, per bar redraw) under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg")
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--dump-before=time_thread_time_ns",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--instr-child",
            ],
            check=True,
            capture_output=True,
            env=env,
        )
        parts = sorted(glob.glob(out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1]))

        def total(path: str) -> int:
            return next(int(line.split()[1]) for line in open(path) if line.startswith(("totals:", "summary:")))

        return total(parts[1]) / INSTR_CALLS, total(parts[2]) / INSTR_CALLS, total(parts[3]) / 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--instr", action="store_true", help="instructions per step under callgrind (slow: minutes)")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: torch's default; 1 steadies a busy machine)"
    )
    parser.add_argument("--instr-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--steps", type=int, default=0, help="steps of workload A per run (0: its own; fewer for a quick check)"
    )
    args = parser.parse_args()
    W.steps = args.steps or W.steps
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.instr_child:
        instr_child()
        return
    if args.instr:
        plain, timed, redraw = instr_counts()
        print(
            f"4. instructions (callgrind): hook call plain {plain:,.0f}, timed {timed:,.0f} (+{timed - plain:,.0f} per "
            f"timed call); one bar redraw {redraw:,.0f}"
        )
        return
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}")
    plain, timed = call_cost()
    print(f"1. one hook call: plain {plain:.0f} ns, timed {timed:.0f} ns (+{timed - plain:.0f} ns per timed call)")
    for extra in (False, True):
        off, on, d = trainer_cost(args.rounds, extra)
        label = "default hooks" + (" + every-iter hook" if extra else "")
        print(
            f"2. workload A, {label:<32} timing off {off:7.1f} µs/step, on {on:7.1f} µs/step, paired Δ {d:+.2f} "
            f"µs/step (median of {args.rounds})"
        )
    calls, redraw = bar_costs()
    print(
        f"3. progress bar: {calls} hook calls per training iteration; one redraw {redraw:.2f} ms on rich's thread "
        f"(at 2 redraws/s: {redraw * 2 / 10:.3f} % of the training thread's time)"
    )


if __name__ == "__main__":
    main()
