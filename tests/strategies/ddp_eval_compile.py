"""Evaluation and compile through the DDP strategy; run under torchrun (2 processes) or alone (reference).

Usage: ddp_eval_compile.py OUT_DIR

1. ``Trainer.val()`` / ``test()`` over 23 samples (odd: the sharded loader pads one rank with
   a duplicate), metrics gathered without the padding: they must equal one process's.
2. ``compile=dict(backend=...)`` (a counting backend that runs the graph eagerly: no C
   compiler needed): the module DDP wraps is the compiled one, and the training forward
   that goes through DDP runs compiled graphs.
Writes OUT_DIR/result_rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw
from trainwright.evaluation import Metric

N, C = 23, 4
GRAPHS: list[int] = []


def counting_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
    GRAPHS.append(len(gm.graph.nodes))
    return gm.forward


class Clf(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, C)

    def forward(self, x, idx=None, y=None, mode="tensor"):
        out = self.linear(x)
        if mode == "loss":
            return {"loss": F.cross_entropy(out, y)}
        return out


class SampleIds(Metric):
    """Per-sample layout: which dataset index each result belongs to (every one exactly once)."""

    def process(self, data_batch, outputs) -> None:
        self.results.extend(int(i) for i in data_batch[1])

    def compute(self, results) -> dict[str, float]:
        return {"ids": sorted(results) == list(range(N)), "n": len(results)}


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ.get("RANK", 0))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, 6, generator=g)
    ds = TensorDataset(x, torch.arange(N), torch.randint(0, C, (N,), generator=g))
    torch.manual_seed(0)
    trainer = tw.Trainer(
        model=Clf(),
        work_dir=out,
        train_dataloader=dict(dataset=ds, batch_size=4, shuffle=True),
        val_dataloader=dict(dataset=ds, batch_size=4),
        test_dataloader=dict(dataset=ds, batch_size=5, shuffle=True),
        val_evaluator=[dict(type="Accuracy", topk=(1, 2)), SampleIds()],
        test_evaluator=[dict(type="Accuracy", topk=(1, 2)), SampleIds()],
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=2),
        default_hooks=dict(checkpoint=None),
        compile=dict(backend=counting_backend),
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    val, test = trainer.val(), trainer.test()
    before_train = len(GRAPHS)
    trainer.train()
    model = trainer.model
    result = {
        "world_size": trainer.strategy.world_size,
        "val": val,
        "test": test,
        "wrapper": type(model).__name__,
        # DDP wraps the user's module, compiled in place (not a compiled wrapper around DDP)
        "wraps_compiled": getattr(model, "module", model) is trainer.unwrapped_base
        and trainer.unwrapped_base._compiled_call_impl is not None,
        "graphs_eval": before_train,
        "graphs_train": len(GRAPHS) - before_train,  # the training forward, through DDP, compiled
    }
    (out / f"result_rank{rank}.json").write_text(json.dumps(result))
    trainer.close()


if __name__ == "__main__":
    main()
