"""What retention (thinning to weights) and exports during training cost the training thread, next to a save.

Run:  python benchmarks/retention_export.py [--state-mb 40] [--saves 8] [--interval 4] [--rounds 2] [--threads 1]

Trains an MLP (weights + SGD momentum about ``--state-mb`` MiB) through the Trainer, saving every ``--interval``
iterations, in four set-ups: a synchronous save (keep the last 2), an async save (keep the last 2), an async save
with ``keep=dict(last=2, weights_every=2 * interval)`` (every other old checkpoint thinned to weights in the
background), and the same plus ``SafetensorsExportHook(interval)``. The training thread's time in each hook comes
from the per-hook timing (``trainer.hooks.report()``): the checkpoint hook's ``after_train_iter`` per save, the
export hook's per export. The stall ratio is that time over the synchronous save's; the run's wall time per
iteration shows what the background threads take from training on this machine's cores.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw


class MLP(tw.BaseModel):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])

    def forward(self, x: torch.Tensor, mode: str = "tensor") -> Any:  # noqa: D102
        out = self.net(x)
        return {"loss": out.pow(2).mean()} if mode == "loss" else out


def run(work: Path, width: int, layers: int, iters: int, interval: int, setup: str) -> tuple[float, float, float]:
    """(checkpoint hook ms per save, export hook ms per export, wall ms per iteration) of one run."""
    torch.manual_seed(0)
    ckpt: dict[str, Any] = dict(by_epoch=False, interval=interval, max_keep_ckpts=2, save_last=False)
    hooks: list[Any] = []
    if setup != "sync":
        ckpt["async_save"] = True
    if setup in ("thin", "thin+export"):
        ckpt.pop("max_keep_ckpts")
        ckpt["keep"] = dict(last=2, weights_every=2 * interval)
    if setup == "thin+export":
        hooks.append(dict(type="SafetensorsExportHook", interval=interval, at_end=False))
    data = TensorDataset(torch.randn(64, width))
    t = tw.Trainer(
        model=MLP(width, layers),
        work_dir=work,
        train_dataloader=DataLoader(data, batch_size=8, collate_fn=lambda b: {"x": torch.stack([x for (x,) in b])}),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=1e-4, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        default_hooks=dict(checkpoint=ckpt, logger=dict(interval=1000)),
        custom_hooks=hooks,
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    with t:
        t0 = time.perf_counter()
        t.train()
        wall = time.perf_counter() - t0
        rows = {(r.hook, r.event): r for r in t.hooks.report()}
    saves = iters // interval
    c = rows[("CheckpointHook", "after_train_iter")]
    e = rows.get(("SafetensorsExportHook", "after_train_iter"))
    return c.total_s / saves * 1e3, (e.total_s / saves * 1e3 if e else 0.0), wall / iters * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--state-mb", type=float, default=40.0, help="weights + momentum, MiB")
    parser.add_argument("--saves", type=int, default=8)
    parser.add_argument("--interval", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the four set-ups, interleaved")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: no OpenMP spinning)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    width = 1024
    layers = max(1, round(args.state_mb * 2**20 / 8 / (width * width + width)))
    iters = args.saves * args.interval
    setups = ("sync", "async", "thin", "thin+export")
    res: dict[str, list[tuple[float, float, float]]] = {s: [] for s in setups}
    for _ in range(args.rounds):
        for s in setups:
            with tempfile.TemporaryDirectory() as d:
                res[s].append(run(Path(d), width, layers, iters, args.interval, s))
    n = layers * (width * width + width)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; MLP {n / 1e6:.1f}M params, state "
        f"{n * 8 / 2**20:.0f} MiB; {args.saves} saves every {args.interval} iterations; {args.rounds} rounds "
        "(median of the rounds)"
    )
    sync = statistics.median(r[0] for r in res["sync"])
    print(f"{'set-up':<32}{'ckpt hook ms/save':>18}{'export ms/export':>18}{'stall ratio':>12}{'wall ms/iter':>14}")
    for s in setups:
        c, e, w = (statistics.median(r[i] for r in res[s]) for i in range(3))
        print(f"{s:<32}{c:>18.1f}{e:>18.1f}{(c + e) / sync:>12.1%}{w:>14.1f}")


if __name__ == "__main__":
    main()
