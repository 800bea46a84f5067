"""SIGTERM wherever it arrives (a slow batch fetch, a long validation, the first compile, a save in progress): the
preemption bound test's runs, in one child process (``python preempt_train.py OUT``).

For each case: a run that sends itself SIGTERM from inside the slow operation (which then takes ``SLOW_S`` more
seconds; the watchdog's grace is shorter), then a run that resumes from its checkpoint; plus the uninterrupted
references (plain and compiled). ``OUT/results.json`` holds, per case, the checkpoint's iteration, the seconds the hook
measured, whether training stopped, and whether the resumed final weights equal the reference's bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import trainwright as tw
from trainwright.checkpoint import read_latest
from trainwright.evaluation.metric import Metric

#: How long each slow operation goes on after the signal (the watchdog's grace is GRACE_S).
SLOW_S = 1.0
GRACE_S = 0.5
MAX_ITERS = 8


def sigterm_myself() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class Reg(tw.BaseModel):
    """A 2-layer regression net; with ``slow_eval`` each evaluation forward takes 0.6 s (longer than the grace) and
    the third sends SIGTERM first."""

    def __init__(self, slow_eval: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 1)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        self.slow_eval, self.eval_calls = slow_eval, 0

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:  # noqa: D102
        if self.slow_eval and not self.training:
            self.eval_calls += 1
            if self.eval_calls == 3:
                sigterm_myself()
            slow_read(0.6)
        out = self.b(torch.relu(self.a(x)))
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else [out]


class SlowFetch(Dataset):
    """The dataset; its ``trap``-th read sends SIGTERM and then takes SLOW_S (a slow network read)."""

    def __init__(self, data: TensorDataset, trap: int | None) -> None:
        self.data, self.trap, self.reads = data, trap, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        self.reads += 1
        if self.reads == self.trap:
            sigterm_myself()
            slow_read(SLOW_S)
        return self.data[i]


def slow_read(seconds: float) -> None:
    time.sleep(seconds)


class SlowSave(tw.Hook):
    """The save of iteration 4 takes SLOW_S after the signal came (a slow file system)."""

    def before_save_checkpoint(self, trainer, checkpoint) -> None:  # noqa: D102
        if trainer.progress.iteration == 4:
            sigterm_myself()
            slow_read(SLOW_S)


class SlowCompiler:
    """A torch.compile backend whose first compilation takes SLOW_S after the signal came (a big model's inductor
    compile); it then runs the captured graph as it is."""

    def __init__(self, trap: bool) -> None:
        self.trap = trap

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        if self.trap:
            self.trap = False
            sigterm_myself()
            slow_read(SLOW_S)
        return gm.forward


class Count(Metric):
    """The number of validation samples."""

    def process(self, data_batch: Any, outputs: Any) -> None:  # noqa: D102
        self.results.append(len(outputs[0]))

    def compute(self, results: list) -> dict[str, float]:  # noqa: D102
        return {"n": float(sum(results))}


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(48, 1, generator=g))


def trainer(work: Path, case: str, trap: bool) -> tw.Trainer:
    hooks: list[tw.Hook] = []
    extra: dict[str, Any] = {}
    train = data()
    if case == "fetch":
        train = SlowFetch(train, 4 * 2 + 3 if trap else None)  # inside the fetch of batch 3
    if case == "validation":
        extra = dict(val_dataloader=dict(dataset=data(), batch_size=8), val_evaluator=Count())
    if case == "save" and trap:
        hooks.append(SlowSave())
    if case == "compile":
        extra["compile"] = dict(backend=SlowCompiler(trap))
    return tw.Trainer(
        model=Reg(slow_eval=case == "validation" and trap),
        work_dir=work,
        experiment_name="resumed" if not trap and (work / "checkpoints").exists() else "run",
        train_dataloader=dict(dataset=train, batch_size=4, shuffle=True),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=MAX_ITERS, val_interval=4),
        default_hooks=dict(
            checkpoint=dict(by_epoch=False, interval=4),
            preemption=dict(exit_code=None, grace_s=GRACE_S),
            logger=dict(interval=1),
        ),
        custom_hooks=hooks,
        randomness=dict(seed=0),
        resume=True,
        **extra,
    )


def final_weights(t: tw.Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.unwrapped_model.state_dict().items()}


def main() -> None:
    out = Path(sys.argv[1])
    cases = sys.argv[2:] or ["fetch", "validation", "compile", "save"]
    results: dict[str, Any] = {}
    refs: dict[str, dict[str, torch.Tensor]] = {}
    for case in cases:
        kind = "compile" if case == "compile" else "plain"
        if kind not in refs:
            with trainer(out / f"ref_{kind}", kind, trap=False) as ref:
                ref.train()
                refs[kind] = final_weights(ref)
        work = out / case
        with trainer(work, case, trap=True) as t:
            t.train()
            hook = next(h for h in t.hooks if type(h).__name__ == "PreemptionHook")
            got: dict[str, Any] = dict(
                stopped_at=t.progress.iteration,
                latest=read_latest(work / "checkpoints"),
                seconds=hook.signal_to_checkpoint_s,
            )
        with trainer(work, case, trap=False) as resumed:
            resumed.train()
            weights = final_weights(resumed)
            got["resumed_iters"] = resumed.progress.iteration
        got["exact"] = all(torch.equal(weights[k], v) for k, v in refs[kind].items())
        results[case] = got
        print(case, got, flush=True)
    (out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
