"""Faults on one rank of a 2-process DDP run (torchrun, gloo): the worker of tests/dist/test_rank_faults.py.

Usage: fault_train.py OUT_DIR SCENARIO
  hook-error   rank 1 raises in a hook at iteration 3, inside ``with Trainer(...)``; default (30 min) collective timeout
  val-error    rank 1's metric raises during the validation after epoch 1, with that epoch's checkpoint due
  settings     several Trainers in turn, each given something else on rank 1 (lr, batch size, seed, an FSDP model
  without a bias,
               an empty work dir to resume from)
  nan-skip     nonfinite_loss="skip", a NaN loss on rank 1 at iteration 3
  stuck        rank 0 stops stepping at iteration 3 (rank 1 waits in the all-reduce); rank 1 then gets SIGTERM
  second-signal  (one process) a SIGTERM inside iteration 3, which then hangs; a second SIGTERM 0.5 s later
  short-stream   both ranks' stream declares 4 batches; rank 1's yields 3 (its length was an estimate); default
  collective timeout
  corrupt-copy   FSDP, node-local work dirs: rank 1 resumes from a copy of rank 0's checkpoints whose newest one it
  cannot read
  stop-one-rank  a hook sets trainer.should_stop on rank 1 only: at iteration 3 (iteration-based), then after epoch 1
  (epoch-based,
                 validation and a checkpoint due); default collective timeout
Writes OUT_DIR/<what>_rank<r>.pt (results) and OUT_DIR/raised_at (when the fault happened, time.time()).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw

RANK = int(os.environ.get("RANK", 0))


class Reg(tw.BaseModel):
    """Linear regression; its loss is NaN at the ``nan_at``-th training forward; records the sample ids it trained
    on."""

    def __init__(self, nan_at: int = 0) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.nan_at, self.calls = nan_at, 0
        self.seen: list[int] = []

    def forward(self, x, y=None, ids=None, mode="tensor"):
        out = self.linear(x)
        if mode == "predict":
            return out
        if mode != "loss":
            return out
        self.calls += 1
        if ids is not None:
            self.seen += ids.tolist()
        loss = F.mse_loss(out, y)
        return {"loss": loss * float("nan") if self.calls == self.nan_at else loss}


def data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ torch.randn(4, 1, generator=g), torch.arange(n))


def stamp(out: Path) -> None:
    (out / "raised_at").write_text(repr(time.time()))


class RaiseAt(tw.Hook):
    def __init__(self, out: Path, at: int) -> None:
        self.out, self.at = out, at

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None) -> None:
        if trainer.progress.iteration == self.at:
            stamp(self.out)
            raise ValueError(f"boom from rank {RANK} at iteration {self.at}")


class FailingMetric(tw.evaluation.Metric):
    """Raises in ``process`` on rank 1 (the other rank goes on to gather the results)."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out

    def process(self, data_batch, outputs) -> None:
        if RANK == 1:
            stamp(self.out)
            raise KeyError("metric broke on rank 1")
        self.results += [0.0] * len(outputs)

    def compute(self, results):
        return {"zero": float(sum(results))}


class StallAt(tw.Hook):
    """Rank 0: stops stepping at iteration ``at`` (sleeps); rank 1: a SIGTERM 1 s after it entered that iteration."""

    def __init__(self, out: Path, at: int) -> None:
        self.out, self.at = out, at

    def before_train_iter(self, trainer, batch_idx, data_batch=None) -> None:
        if trainer.progress.iteration + 1 != self.at:
            return
        if RANK == 0:
            time.sleep(120)
        else:
            def term() -> None:
                stamp(self.out)
                os.kill(os.getpid(), signal.SIGTERM)

            threading.Timer(1.0, term).start()


class TwoSignals(tw.Hook):
    """Inside iteration ``at``: SIGTERM, then a hang (the step boundary never comes); a second SIGTERM 0.5 s later."""

    def __init__(self, out: Path, at: int) -> None:
        self.out, self.at = out, at

    def before_train_iter(self, trainer, batch_idx, data_batch=None) -> None:
        if trainer.progress.iteration + 1 == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Timer(0.5, lambda: (stamp(self.out), os.kill(os.getpid(), signal.SIGTERM))).start()
            time.sleep(60)


class ShortStream(torch.utils.data.IterableDataset):
    """Both ranks declare 32 samples (4 batches of 8); rank 1's stream yields 24, then stamps the fault."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def __len__(self) -> int:
        return 32

    def __iter__(self):
        base = data(32)
        yield from (base[i] for i in range(24 if RANK == 1 else 32))
        if RANK == 1:
            stamp(self.out)


class StopOnRank1(tw.Hook):
    """Sets ``trainer.should_stop`` on rank 1 only (a reason of its own): after iteration ``at``, or after epoch
    ``epoch``."""

    def __init__(self, at: int | None = None, epoch: int | None = None) -> None:
        self.at, self.epoch = at, epoch

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None) -> None:
        if RANK == 1 and trainer.progress.iteration == self.at:
            trainer.should_stop = True

    def after_train_epoch(self, trainer) -> None:
        if RANK == 1 and trainer.progress.epoch == self.epoch:
            trainer.should_stop = True


class IdsMetric(tw.evaluation.Metric):
    def process(self, data_batch, outputs) -> None:
        self.results.extend(outputs.flatten().tolist())

    def compute(self, results):
        return {"n": float(len(results))}


def trainer(out: Path, **kw) -> tw.Trainer:
    args = dict(
        model=Reg(), work_dir=out / "work", train_dataloader=dict(dataset=data(), batch_size=8, shuffle=True),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05)), train_cfg=dict(by_epoch=False, max_iters=6),
        default_hooks=dict(logger=dict(interval=2)), randomness=dict(seed=0), log_level="WARNING",
    )
    args.update(kw)
    return tw.Trainer(**args)


def settings(out: Path) -> None:
    """Each case on its own Trainer; every rank raises (or not) at train() start. Results: the error messages, the
    seed case's samples."""
    errors: dict[str, str | None] = {}

    def case(name: str, **kw) -> tw.Trainer:
        t = trainer(out / name, **kw)
        try:
            t.train()
            errors[name] = None
        except Exception as e:  # noqa: BLE001 - recorded: the test reads the message (every rank raises the same one)
            errors[name] = f"{type(e).__name__}: {e}"
        finally:
            t.close()
        return t

    case("lr", optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1 if RANK == 0 else 0.2)))
    case("batch", train_dataloader=dict(dataset=data(), batch_size=8 if RANK == 0 else 4, shuffle=True))
    seeded = case("seed", randomness=dict(seed=0 if RANK == 0 else 5), train_cfg=dict(by_epoch=True, max_epochs=1))
    other = Reg()
    if RANK == 1:  # a model built from a rank-dependent config
        other.linear = nn.Linear(4, 1, bias=False)
    case("model", model=other, strategy="fsdp")
    case("save", default_hooks=dict(checkpoint=dict(by_epoch=False, interval=4)), train_cfg=dict(by_epoch=False, max_iters=4))
    # rank 1's work dir is empty (a node-local disk); rank 0's holds iter_4.pth
    case("resume", work_dir=out / ("save" if RANK == 0 else "empty") / "work", resume=True, train_cfg=dict(by_epoch=False, max_iters=8))
    torch.save({"errors": errors, "seen": seeded.unwrapped_model.seen, "seed": seeded.seed}, out / f"settings_rank{RANK}.pt")


def main() -> None:
    out, scenario = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    if scenario == "hook-error":
        with trainer(out, custom_hooks=[RaiseAt(out, 3)] if RANK == 1 else [], train_cfg=dict(by_epoch=False, max_iters=1000)) as t:
            t.train()
    elif scenario == "val-error":
        with trainer(
            out, train_cfg=dict(by_epoch=True, max_epochs=2), val_dataloader=dict(dataset=data(16), batch_size=4), val_evaluator=FailingMetric(out),
            default_hooks=dict(checkpoint=dict(interval=1)),
        ) as t:
            t.train()
    elif scenario == "settings":
        settings(out)
    # a NaN on rank 1 at the 3rd micro-batch; then, accumulating 2, at the 4th (the one that syncs its window)
    elif scenario == "nan-skip":
        results = {}
        for name, nan_at, accum in (("plain", 3, 1), ("accum", 4, 2)):
            t = trainer(
                out / name, model=Reg(nan_at=nan_at if RANK == 1 else 0), nonfinite_loss="skip", train_cfg=dict(by_epoch=False, max_iters=8),
                optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9), accumulative_counts=accum),
            )
            t.train()
            params = {k: v.detach().clone() for k, v in t.unwrapped_model.state_dict().items()}
            results[name] = {"params": params, "iteration": t.progress.iteration, "skipped": t.optim_wrapper.skipped_steps}
            t.close()
        torch.save(results, out / f"nan_rank{RANK}.pt")
    elif scenario == "stuck":
        with trainer(out, custom_hooks=[StallAt(out, 3)], default_hooks=dict(preemption=dict(grace_s=2.0)), train_cfg=dict(by_epoch=False, max_iters=1000)) as t:
            t.train()
    elif scenario == "second-signal":
        with trainer(out, custom_hooks=[TwoSignals(out, 3)], default_hooks=dict(preemption=dict(grace_s=30.0)), train_cfg=dict(by_epoch=False, max_iters=1000)) as t:
            t.train()
    elif scenario == "stop-one-rank":
        results = {}
        t = trainer(out / "iter", custom_hooks=[StopOnRank1(at=3)], train_cfg=dict(by_epoch=False, max_iters=40))
        t.train()
        results["iter"] = t.progress.iteration
        t.close()
        t = trainer(
            out / "epoch", custom_hooks=[StopOnRank1(epoch=1)], train_cfg=dict(by_epoch=True, max_epochs=4),
            val_dataloader=dict(dataset=data(16), batch_size=4), val_evaluator=IdsMetric(), default_hooks=dict(checkpoint=dict(interval=1)),
        )
        t.train()
        results["epoch"] = (t.progress.epoch, t.progress.iteration)
        t.close()
        torch.save(results, out / f"stop_rank{RANK}.pt")
    elif scenario == "corrupt-copy":
        import shutil

        import torch.distributed as dist

        saving = dict(checkpoint=dict(by_epoch=False, interval=4, max_keep_ckpts=5))
        with trainer(out / "first", work_dir=out / ("work0" if RANK == 0 else "scratch1"), strategy="fsdp", default_hooks=saving) as t:
            t.train()  # 6 iterations: iter_4.dcp, then the final iter_6.dcp (in rank 0's work dir)
        dist.barrier()
        if RANK == 1:  # rank 1's node-local copy, its newest checkpoint's shard files truncated
            shutil.copytree(out / "work0" / "checkpoints", out / "work1" / "checkpoints")
            for f in (out / "work1" / "checkpoints" / "iter_6.dcp").glob("*.distcp"):
                f.write_bytes(f.read_bytes()[:100])
        dist.barrier()
        with trainer(out / "resumed", work_dir=out / f"work{RANK}", strategy="fsdp", resume=True, train_cfg=dict(by_epoch=False, max_iters=8)) as t:
            t.train()
            torch.save(t.checkpoints.restored[1], out / f"resumed_rank{RANK}.pt")
    elif scenario == "short-stream":
        with trainer(out, train_dataloader=torch.utils.data.DataLoader(ShortStream(out), batch_size=8), train_cfg=dict(by_epoch=True, max_epochs=2)) as t:
            t.train()
    else:
        raise SystemExit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main()
