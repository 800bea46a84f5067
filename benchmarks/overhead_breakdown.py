"""Where trainwright's per-step cost on workload A goes, layer by layer.

Adds one engine layer at a time to a hand-written loop and times each variant (medians of
alternating rounds, µs per step):

  raw            the hand-written loop (model + cross_entropy, backward, step, zero_grad)
  basemodel      + the model is a tw.BaseModel called as model(x, y, mode="loss")
  loader         + the data comes through trainwright's resumable loader
  train_step     + model.train_step(batch, OptimWrapper): preprocess, optim_context, parse_losses, update_params
  trainer        the Trainer with every default hook switched off (loop, metric store)
  +<hook>        the Trainer with only that stock hook on
  default        the Trainer with its default hooks

Run:  python benchmarks/overhead_breakdown.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import overhead as ov  # noqa: E402

import trainwright as tw  # noqa: E402
from trainwright.data.loader import build_dataloader  # noqa: E402
from trainwright.optim import OptimWrapper  # noqa: E402

W = ov.WORKLOADS["A"]
STOCK = ("timer", "logger", "param_scheduler", "checkpoint", "sampler_seed", "preemption", "progress_bar")


class Net(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = ov.make_mlp(W.sizes)

    def forward(self, x, y=None, mode="tensor"):
        out = self.mlp(x)
        return {"loss": F.cross_entropy(out, y)} if mode == "loss" else out


def hand_loop(variant: str, init: dict, data) -> float:
    net = Net()
    net.mlp.load_state_dict(init)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(data, batch_size=W.batch)
    if variant in ("loader", "train_step"):
        loader = build_dataloader(loader)
    ow = OptimWrapper(opt)
    t0 = time.perf_counter()
    for batch in loader:
        if variant == "train_step":
            net.train_step(batch, ow)
            continue
        x, y = batch
        loss = F.cross_entropy(net.mlp(x), y) if variant == "raw" else net(x, y, mode="loss")["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad()
    return time.perf_counter() - t0


def trainer_loop(default_hooks: dict | None, init: dict, data, work_dir: str) -> float:
    watch = ov.stopwatch()
    net = Net()
    net.mlp.load_state_dict(init)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = tw.Trainer(
            model=net,
            work_dir=work_dir,
            train_dataloader=DataLoader(data, batch_size=W.batch),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01, momentum=0.9)),
            train_cfg=dict(by_epoch=True, max_epochs=1),
            default_hooks=default_hooks,
            custom_hooks=[watch],
            randomness=dict(seed=0),
        )
        trainer.train()
    trainer.close()
    return watch.t1 - watch.t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--steps", type=int, default=0, help="steps of workload A per run (0: its own; fewer for a quick check)"
    )
    args = parser.parse_args()
    W.steps = args.steps or W.steps
    torch.manual_seed(0)
    init = ov.make_mlp(W.sizes).state_dict()
    data = ov.make_data(W)
    off = {k: None for k in STOCK}
    with tempfile.TemporaryDirectory() as tmp:
        variants = {v: (lambda v=v: hand_loop(v, init, data)) for v in ("raw", "basemodel", "loader", "train_step")}
        variants["trainer"] = lambda: trainer_loop(off, init, data, tmp)
        for name in STOCK:
            cfg = {k: v for k, v in off.items() if k != name}
            variants[f"+{name}"] = lambda cfg=cfg: trainer_loop(cfg, init, data, tmp)
        variants["default"] = lambda: trainer_loop(None, init, data, tmp)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():
            fn()  # warm-up
        for _ in range(args.rounds):
            for k, fn in variants.items():
                times[k].append(fn())
    raw = statistics.median(times["raw"])
    trainer = statistics.median(times["trainer"])
    print(f"workload A ({W.steps} steps), µs per step (median of {args.rounds}); Δ vs raw, and for +hook Δ vs trainer")
    for k, v in times.items():
        m = statistics.median(v)
        ref = trainer if k.startswith("+") else raw
        print(f"  {k:<18} {m / W.steps * 1e6:7.1f}   Δ {(m - ref) / W.steps * 1e6:+6.1f}")


if __name__ == "__main__":
    main()
