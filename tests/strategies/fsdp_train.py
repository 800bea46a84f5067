"""Runs of a small regression MLP with the Trainer under FSDP (torchrun or one process) and references; one process
start runs several.

Usage: fsdp_train.py OUT_DIR [--trainer-group] RUN [RUN ...]
Each RUN is ``name:strategy:batch:iters[:opt=value...]`` with options ``accum=N``,
``clip=X``, ``reclip=X`` (``optim_wrapper.clip_grad = dict(max_norm=X)`` in a hook's
before_train, after the strategy prepared the run), ``save=N`` (checkpoint every N
iterations), ``keep=K``, ``async=1``, ``resume=1`` (newest in work_dir) or ``resume=PATH``,
``weights=1`` (save_weights), ``precision=bf16-mixed``, ``lr=X``, ``load=PATH`` (load_from),
``work=NAME`` (work_dir name, default: the run's name), ``norms=1`` (NormsHook every 2 iterations,
per module), ``ema=1`` (EMAHook, momentum 0.1), ``swa=E`` (SWAHook from epoch E, swa_lr 0.05), ``epochs=N`` (an
epoch-based run of N epochs; ITERS unused),
``nanat=K`` (rank 1's K-th training loss is NaN; the FloatingPointError is recorded; with ``skipnan=1``:
nonfinite_loss="skip"), ``sigterm=K`` (rank 1 sends itself SIGTERM before its K-th step: the preemption hook saves
and asks to exit; the exit status is recorded), ``prof=1`` (ProfilerHook recording iterations 2-3; the trace files are
listed), ``unseeded=1`` (the model built
from seed 100 + rank: each process draws its own initial weights, as a script that does not seed). ``es=P`` (validation
every epoch on 16
samples with an MSE metric, EarlyStoppingHook(val/mse, patience P), save_best val/mse and published_keys meta, model;
with
``ema=1`` the validation reports the training weights as val/raw/mse too).
Under torchrun the script makes the process group itself and destroys it after the runs;
with ``--trainer-group`` it does not: the first Trainer's strategy joins the group from the
launcher's environment and the later ones find it. OUT_DIR/exit_rank<r>.json then tells
whether a process group was still initialized after trainwright's exit handler ran.
Writes OUT_DIR/NAME/result_rank<r>.pt: the full parameters (gathered, rank 0), the last
gradient norm and its type, the dtype the first layer's weight had inside the forward, the
strategy, and whether a process group was initialized after ``trainer.close()``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainwright as tw
from trainwright.evaluation.metric import Metric


class Linear(nn.Linear):
    """nn.Linear that records the dtype its weight has while it runs (FSDP gathers it for its forward)."""

    seen_dtype: torch.dtype | None = None

    def forward(self, x):
        self.seen_dtype = self.weight.dtype
        return super().forward(x)


class Reclip(tw.Hook):
    """Sets ``clip_grad`` once the run is prepared (as a user's hook or a second ``train()`` would)."""

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm

    def before_train(self, trainer) -> None:
        trainer.optim_wrapper.clip_grad = dict(max_norm=self.max_norm)


class SigtermAt(tw.Hook):
    """Sends this process SIGTERM before its ``at``-th step (as a scheduler preempting one node)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def before_train_iter(self, trainer, batch_idx, data_batch=None) -> None:
        if trainer.progress.iteration + 1 == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


class StuckBefore(tw.Hook):
    """Waits 2.5 s before this process's ``at``-th step (a rank stuck in user code while the others wait in a
    collective)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def before_train_iter(self, trainer, batch_idx, data_batch=None) -> None:
        if trainer.progress.iteration + 1 == self.at:
            stuck_in_user_code()


def stuck_in_user_code() -> None:
    import time

    time.sleep(2.5)


class _Messages(logging.Handler):
    """Keeps the messages of a trainer's logger that reach this rank's output."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class MLP(tw.BaseModel):
    def __init__(self, nan_at: int = -1) -> None:
        super().__init__()
        self.l1 = Linear(4, 8)
        self.l2 = Linear(8, 1)
        self.nan_at, self.calls = nan_at, 0

    def forward(self, x, y=None, mode="tensor"):
        out = self.l2(torch.tanh(self.l1(x)))
        if mode != "loss":
            return out
        loss = F.mse_loss(out.float(), y)
        self.calls += 1
        return {"loss": loss * float("nan") if self.calls == self.nan_at else loss}


class MSE(Metric):
    """Mean squared error over the validation set (every rank's samples)."""

    batched_results = True

    def process(self, data_batch, outputs) -> None:
        self.results.append(((outputs.float() - data_batch[1]) ** 2).mean(1))

    def compute(self, results) -> dict[str, float]:
        return {"mse": float(torch.cat(results).mean())}


def run(out: Path, spec: str) -> None:
    name, strategy, batch, iters, *opts = spec.split(":")
    o = dict(kv.split("=", 1) for kv in opts)
    rank = int(os.environ.get("RANK", 0))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    ds = TensorDataset(x, torch.sin(x @ torch.randn(4, 1, generator=g)) + 0.1 * torch.randn(64, 1, generator=g))
    tw.seed_everything(
        100 + rank if o.get("unseeded") == "1" else 0
    )  # unseeded=1: another draw on each rank, as a script that does not seed
    model = MLP(
        nan_at=int(o["nanat"]) if "nanat" in o and rank == 1 else -1
    )  # same initial weights everywhere (seeded)
    resume: bool | str = o.get("resume", "0")
    resume = True if resume == "1" else (False if resume == "0" else resume)
    save = int(o.get("save", 0))
    ema = tw.hooks.EMAHook(momentum=0.1, evaluate_on="both") if o.get("ema") == "1" else None
    es = int(o.get("es", 0))
    xv = torch.randn(16, 4, generator=g)
    val = (
        dict(
            val_dataloader=dict(
                dataset=TensorDataset(xv, torch.sin(xv @ torch.ones(4, 1))), batch_size=int(batch) // 2
            ),
            val_evaluator=MSE(),
            val_cfg=dict(),
        )
        if es
        else {}
    )
    best = dict(save_best="val/mse", rule="less", published_keys=["meta", "model"]) if es else {}
    trainer = tw.Trainer(
        model=model,
        work_dir=out / o.get("work", name),
        train_dataloader=dict(dataset=ds, batch_size=int(batch), shuffle=True),
        optim_wrapper=dict(
            optimizer=dict(type="SGD", lr=float(o.get("lr", 0.1)), momentum=0.9),
            accumulative_counts=int(o.get("accum", 1)),
            clip_grad=dict(max_norm=float(o["clip"])) if "clip" in o else None,
        ),
        train_cfg=dict(by_epoch=True, max_epochs=int(o["epochs"]))
        if "epochs" in o
        else dict(by_epoch=False, max_iters=int(iters)),
        default_hooks=dict(
            logger=dict(interval=2, flush_secs=0),
            **({"norms": dict(interval=2)} if o.get("norms") == "1" else {}),
            **({"stall": dict(timeout_s=1.0)} if "stall" in o else {}),
            checkpoint=dict(
                by_epoch=False,
                interval=save or -1,
                save_last=bool(save),
                max_keep_ckpts=int(o.get("keep", -1)),
                async_save=o.get("async") == "1",
                **best,
            ),
        ),
        strategy=dict(type="fsdp", shard_modules=["Linear"]) if strategy == "fsdp" else strategy,
        precision=o.get("precision", "32"),
        resume=resume,
        load_from=o.get("load"),
        custom_hooks=([Reclip(float(o["reclip"]))] if "reclip" in o else [])
        + ([tw.hooks.SWAHook(int(o["swa"]), swa_lr=0.05, anneal_epochs=1)] if "swa" in o else [])
        + ([tw.hooks.ProfilerHook(wait=0, warmup=1, active=2)] if o.get("prof") == "1" else [])
        + ([ema] if ema is not None else [])
        + ([SigtermAt(int(o["sigterm"]))] if "sigterm" in o and rank == 1 else [])
        + ([StuckBefore(int(o["stall"]))] if "stall" in o and rank == 1 else [])
        + ([tw.hooks.EarlyStoppingHook("val/mse", rule="less", patience=es)] if es else []),
        **val,
        randomness=dict(seed=0),
        log_level="WARNING",
        nonfinite_loss="skip" if o.get("skipnan") == "1" else "raise",
    )
    messages = _Messages()
    trainer.logger.addHandler(messages)
    error = exit_code = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.train()
        except (
            RuntimeError,
            FloatingPointError,
        ) as e:  # recorded for the test (e.g. a checkpoint refused inside an accumulation window)
            error = f"{type(e).__name__}: {e}"
        except SystemExit as e:  # preempted: the checkpoint is written, the hook asks to exit with 128 + signal
            exit_code = e.code
    if o.get("weights") == "1":
        trainer.save_weights(out / name / "weights.safetensors")
    full = trainer.strategy.full_model_state_dict()
    averaged = (
        ema.state_dict()["averaged"] if ema is not None and ema.ema is not None else {}
    )  # DTensors under FSDP: whole ones below (a collective)
    averaged = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in averaged.items()}
    # a resumed sharded run: how the checkpoint's hook averages come back from strategy.load_checkpoint (sharded or
    # whole)
    loaded = {}
    if (
        trainer.checkpoints.restored
        and trainer.strategy.name == "fsdp"
        and str(trainer.checkpoints.restored[0]).endswith(".dcp")
    ):
        loaded = _tensor_leaves(trainer.strategy.load_checkpoint(trainer.checkpoints.restored[0])["hooks"])
    ow = trainer.optim_wrapper
    result = {
        "params": {k: v.detach().clone() for k, v in full.items()},
        "grad_norm": None if type(ow.grad_norm) is not torch.Tensor else ow.grad_norm.detach().clone(),
        "grad_norm_type": type(ow.grad_norm).__name__,
        "seen_dtype": str(model.l1.seen_dtype),
        "param_dtype": str(next(iter(trainer.unwrapped_model.parameters())).dtype),
        "strategy": trainer.strategy.name,
        "world_size": trainer.strategy.world_size,
        "iteration": trainer.progress.iteration,
        "warnings": [str(w.message) for w in caught],
        "error": error,
        "skipped": ow.skipped_steps,
        "exit_code": exit_code,
        "traces": sorted(str(p.relative_to(out)) for p in (out / o.get("work", name)).rglob("trace_rank*.json")),
        "scaler": type(getattr(ow.precision, "scaler", None)).__name__,
        "restored": str(trainer.checkpoints.restored[0]) if trainer.checkpoints.restored else None,
        "ema": {k: v.detach().cpu().clone() for k, v in averaged.items()},
        "val": [{k: v for k, v in r.items() if k.startswith("val/")} for r in _records(trainer, "val")],
        "epoch": trainer.progress.epoch,
        "loaded_hook_tensors": loaded,
        "logged": messages.messages,
        "norms": [
            n
            for n in (
                {k: v for k, v in r.items() if k.split("/")[0] in ("grad_norm", "param_norm", "update_ratio")}
                for r in _records(trainer)
            )
            if n
        ],
    }
    trainer.close()
    result["group_after_close"] = dist.is_initialized()
    (out / name).mkdir(parents=True, exist_ok=True)
    torch.save(result, out / name / f"result_rank{rank}.pt")


def _tensor_leaves(obj, path: str = "") -> dict:
    """``{path: (type name, global shape, this process's shape)}`` of each tensor in ``obj``."""
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return {path: (type(obj).__name__, tuple(obj.shape), tuple(local.shape))}
    if isinstance(obj, dict):
        return {k: v for key, sub in obj.items() for k, v in _tensor_leaves(sub, f"{path}/{key}").items()}
    return {}


def _records(trainer: tw.Trainer, mode: str = "train") -> list[dict]:
    """The training (or validation) records of metrics.jsonl (rank 0 writes it; other ranks read none)."""
    path = trainer.run_dir / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("mode") == mode] if path.exists() else []


def main() -> None:
    out = Path(sys.argv[1])
    specs = sys.argv[2:]
    trainer_group = specs[:1] == ["--trainer-group"]
    if trainer_group:
        specs = specs[1:]
        rank = os.environ.get("RANK", "0")
        # registered before trainwright's handler, so it runs after it (atexit runs last-in first-out)
        atexit.register(
            lambda: (out / f"exit_rank{rank}.json").write_text(
                json.dumps({"initialized_at_exit": dist.is_initialized()})
            )
        )
    launched = "WORLD_SIZE" in os.environ and not trainer_group
    if launched:  # one process group for all the runs (the trainers join it and leave it to us)
        dist.init_process_group("gloo")
    for spec in specs:
        run(out, spec)
    if launched:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
