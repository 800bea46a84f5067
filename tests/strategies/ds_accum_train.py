"""Train the regression model under DDP and under DeepSpeed (torchrun, 2 processes); save rank 0's weights.

Twice: with accumulation and clipping under ZeRO-2, and plainly (momentum, no clipping) under the default config.

Usage: torchrun --nproc_per_node=2 ds_accum_train.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import LinearReg, regression_set  # noqa: E402

import trainwright as tw  # noqa: E402


def run(strategy: dict | str, out: Path, plain: bool = False, batch: int = 8) -> dict[str, torch.Tensor]:
    """``plain``: no accumulation and no clipping, SGD with momentum, batches of 8 (the issue's 2x8 run)."""
    optim = (
        dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9))
        if plain
        else dict(optimizer=dict(type="SGD", lr=0.05), accumulative_counts=2, clip_grad=dict(max_norm=0.3))
    )
    trainer = tw.Trainer(
        model=LinearReg(),
        work_dir=out,
        strategy=strategy,
        randomness=dict(seed=0),
        log_level="WARNING",
        train_dataloader=dict(
            dataset=regression_set(32 if plain else 24), batch_size=batch if plain else 2, shuffle=plain
        ),
        optim_wrapper=optim,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        default_hooks=dict(checkpoint=None),
    )
    trainer.train()
    weights = {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    trainer.close()
    return weights


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")  # one group for both trainers
    ddp = run(dict(type="ddp"), out / "ddp")
    ds = run(dict(type="deepspeed", config=dict(zero_optimization=dict(stage=2))), out / "ds")
    # the default config, no clip_grad: DeepSpeed's own default would clip at 1.0
    ddp_plain = run(dict(type="ddp"), out / "ddp_plain", plain=True)
    ds_plain = run("deepspeed", out / "ds_plain", plain=True)
    if dist.get_rank() == 0:
        torch.save(
            {"ddp": ddp, "deepspeed": ds, "ddp_plain": ddp_plain, "deepspeed_plain": ds_plain}, out / "weights.pt"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
