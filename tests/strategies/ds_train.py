"""Train the digits example with strategy='deepspeed' (ZeRO-2) under torchrun; write each rank's result.

Usage: ds_train.py OUT_DIR
Runs, in one process group: ``full`` (3 epochs), ``split`` (2 epochs, then a new trainer
resumes its checkpoint to 3). Writes OUT_DIR/<run>/result_rank<r>.pt: the validation
metrics, the final parameters, the strategy's name and the DeepSpeed optimizer class.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import trainwright as tw
from trainwright.config import Config

ROOT = Path(__file__).resolve().parents[2]


def run(out: Path, epochs: int, resume: bool) -> None:
    cfg = Config.fromfile(ROOT / "examples" / "digits.py")
    trainer = tw.Trainer.from_config(
        cfg,
        work_dir=str(out),
        experiment_name="run",
        log_level="WARNING",
        resume=resume,
        model=dict(type="DigitsNet", hidden=128, dropout=0.0),
        strategy=dict(type="deepspeed", config=dict(zero_optimization=dict(stage=2))),
        train_cfg=dict(by_epoch=True, max_epochs=epochs, val_interval=3),
        default_hooks=dict(checkpoint=dict(interval=1, max_keep_ckpts=1)),
    )
    trainer.train()
    metrics = trainer.val()
    trainer.save_weights(out / "weights.safetensors")
    result = {
        "metrics": metrics,
        "params": {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()},
        "strategy": trainer.strategy.name,
        "optimizer": type(trainer.strategy.engine.optimizer).__name__,
        "iteration": trainer.progress.iteration,
        # the engine carries out the updates as the wrapper's strategy; nothing of the wrapper is replaced
        "wrapper_untouched": "update_params" not in vars(trainer.optim_wrapper)
        and trainer.optim_wrapper.strategy is trainer.strategy,
    }
    trainer.close()
    torch.save(result, out / f"result_rank{os.environ.get('RANK', '0')}.pt")


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")  # one group for the three trainers
    run(out / "full", 3, False)
    run(out / "split", 2, False)
    run(out / "split", 3, True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
