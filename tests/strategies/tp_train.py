"""Runs of examples/char_gpt.py's model (tiny) under FSDP + tensor parallel (torchrun) and its references; one process
start runs several.

Usage: tp_train.py OUT_DIR RUN [RUN ...]
Each RUN is ``name:kind:batch:iters[:opt=value...]``: ``kind`` is ``single``, ``fsdp`` (no
tensor parallelism), ``tp1`` (``tensor_parallel=dict(size=1, plan=...)``: the plan kept, not
applied), ``tp2`` / ``tp3`` (the example's plan over 2 / 3 ranks); ``batch`` is per data shard.
FSDP shards each Block as a unit. Options: ``save=N`` (checkpoint every N iterations),
``resume=PATH``, ``plan=bad`` (the example's plan and a pattern that matches nothing),
``plan=callable`` (a function that splits the first block's MLP itself), ``weights=1``
(``save_weights`` after training), ``load=PATH`` (``load_from``), ``lr=X`` (default 0.5), ``ema=1`` (EMAHook, momentum
0.1; the gathered average is recorded),
``unseeded=1`` (the model built from seed 100 + rank: each process draws its own initial weights), ``compile=BACKEND``
(``compile=dict(regions=["Block"], backend=BACKEND)``: each Block compiled before FSDP shards it; the
number of graphs the backend compiled is recorded). Every run clips gradients at max_norm 0.5 and validates
once at the end on 10 sequences (two data shards of 5, one padded), unless ``val=0`` (no validation: a compiled run
would compile the blocks' inference graphs too).
Under torchrun the script makes the process group and destroys it after the runs.
Writes OUT_DIR/NAME/result_rank<r>.pt: the train records of metrics.jsonl (rank 0), the
validation loss, the full parameters (gathered), the last gradient norm, the strategy's
data-parallel size and rank, warnings, the error a run stopped with (its message), and the number of process groups the
process holds after the run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

import trainwright as tw

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "char_gpt.py"
_spec = importlib.util.spec_from_file_location("char_gpt_example", EXAMPLE)
gpt = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = gpt  # importable by name, as trainwright runs a config file (dynamo looks modules up by name)
_spec.loader.exec_module(gpt)  # registers CharLoss; the plan is the config's


def data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 96, (n, 9), generator=g)
    return TensorDataset(ids[:, :-1], ids[:, 1:])


def split_first_mlp(model, mesh) -> None:
    """A callable plan: what a user writes for anything a pattern plan cannot say."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    assert mesh.mesh_dim_names == ("tp",), mesh
    parallelize_module(model.blocks[0].mlp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


GRAPHS: list = []


def _counting(backend: str):
    """``backend``, counting the graphs it is handed (each compiled frame: forward and backward come as one)."""
    from torch._dynamo import lookup_backend

    inner = lookup_backend(backend)

    def counting(gm, example_inputs):
        GRAPHS.append(gm)
        return inner(gm, example_inputs)

    return counting


def run(out: Path, spec: str) -> None:
    name, kind, batch, iters, *opts = spec.split(":")
    GRAPHS.clear()
    o = dict(kv.split("=", 1) for kv in opts)
    rank = int(os.environ.get("RANK", 0))
    plan = {"bad": {**gpt._tp_plan, "blocks.*.attn.qkv": "colwise"}, "callable": split_first_mlp}.get(
        o.get("plan", ""), gpt._tp_plan
    )
    strategy = "single" if kind == "single" else dict(type="fsdp", shard_modules=["Block"])
    if kind.startswith("tp"):
        strategy["tensor_parallel"] = dict(size=int(kind[2:]), plan=plan)
    tw.seed_everything(
        100 + rank if o.get("unseeded") == "1" else 0
    )  # unseeded=1: another draw on each rank (a script that does not seed)
    model = gpt.CharGPT(block_size=8, dim=16, depth=2, heads=4)  # same initial weights everywhere (seeded)
    save = int(o.get("save", 0))
    ema = tw.hooks.EMAHook(momentum=0.1) if o.get("ema") == "1" else None
    result: dict = {"error": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer = tw.Trainer(
                model=model,
                work_dir=out / name,
                experiment_name="run",
                train_dataloader=dict(dataset=data(64, 1), batch_size=int(batch), shuffle=True),
                **(
                    {}
                    if o.get("val") == "0"
                    else dict(
                        val_dataloader=dict(dataset=data(10, 2), batch_size=2), val_evaluator=dict(type="CharLoss")
                    )
                ),
                optim_wrapper=dict(
                    optimizer=dict(type="SGD", lr=float(o.get("lr", 0.5)), momentum=0.9), clip_grad=dict(max_norm=0.5)
                ),
                train_cfg=dict(by_epoch=False, max_iters=int(iters), val_interval=int(iters)),
                default_hooks=dict(
                    logger=dict(interval=1, flush_secs=0),
                    checkpoint=dict(by_epoch=False, interval=save or -1, save_last=bool(save)),
                ),
                strategy=strategy,
                resume=o.get("resume", False),
                load_from=o.get("load"),
                randomness=dict(seed=0),
                log_level="WARNING",
                custom_hooks=[ema] if ema is not None else [],
                compile=dict(regions=["Block"], backend=_counting(o["compile"])) if "compile" in o else False,
            )
        except ValueError as e:  # recorded for the test (a world size the tensor-parallel size does not divide)
            result["error"] = str(e)
            trainer = None
        if trainer is not None:
            try:
                trainer.train()
            except ValueError as e:  # recorded for the test (a plan pattern that matches nothing)
                result["error"] = str(e)
    if trainer is not None:
        if result["error"] is None:
            if o.get("weights") == "1":
                trainer.save_weights(out / name / "weights.safetensors")
            full = trainer.strategy.full_model_state_dict()
            ow = trainer.optim_wrapper
            averaged = (
                ema.state_dict()["averaged"] if ema is not None else {}
            )  # DTensors on the (dp, tp) mesh: gathered (a collective)
            result["ema"] = {
                k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in averaged.items()
            }
            records = (
                [json.loads(line) for line in (out / name / "run" / "metrics.jsonl").read_text().splitlines()]
                if rank == 0
                else []
            )
            result.update(
                params={k: v.detach().clone() for k, v in full.items()},
                grad_norm=float(ow.grad_norm),
                train=[r for r in records if r["mode"] == "train"],
                val=[r for r in records if r["mode"] == "val"],
                iteration=trainer.progress.iteration,
                graphs=len(GRAPHS),
            )
        result.update(
            world_size=trainer.strategy.world_size,
            data_parallel_size=trainer.strategy.data_parallel_size,
            data_parallel_rank=trainer.strategy.data_parallel_rank,
        )
        trainer.close()
    if (
        dist.is_initialized()
    ):  # the process groups this process holds after the run (torch keeps them until the default group goes)
        result["groups"] = len(dist.distributed_c10d._world.pg_map)
    result["warnings"] = [str(w.message) for w in caught]
    (out / name).mkdir(parents=True, exist_ok=True)
    torch.save(result, out / name / f"result_rank{rank}.pt")


def main() -> None:
    out = Path(sys.argv[1])
    launched = "WORLD_SIZE" in os.environ
    if launched:  # one process group for all the runs (the trainers join it and leave it to us)
        dist.init_process_group("gloo")
    for spec in sys.argv[2:]:
        run(out, spec)
    if launched:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
