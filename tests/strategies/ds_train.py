"""Train the digits example with strategy='deepspeed' (ZeRO-2) under torchrun; write each rank's result.

Usage: ds_train.py OUT_DIR
Writes OUT_DIR/result_rank<r>.pt: the validation metrics, the final parameters, the
strategy's name and the DeepSpeed optimizer class.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import trainwright as tw
from trainwright.config import Config

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    out = Path(sys.argv[1])
    cfg = Config.fromfile(ROOT / "examples" / "digits.py")
    trainer = tw.Trainer.from_config(
        cfg, work_dir=str(out), experiment_name="run", log_level="WARNING",
        strategy=dict(type="deepspeed", config=dict(zero_optimization=dict(stage=2))),
        train_cfg=dict(by_epoch=True, max_epochs=3, val_interval=3),
        default_hooks=dict(checkpoint=dict(interval=3, max_keep_ckpts=1)),
    )
    trainer.train()
    metrics = trainer.val()
    trainer.save_weights(out / "weights.safetensors")
    result = {
        "metrics": metrics,
        "params": {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()},
        "strategy": trainer.strategy.name,
        "optimizer": type(trainer.strategy.engine.optimizer).__name__,
    }
    trainer.close()
    torch.save(result, out / f"result_rank{os.environ.get('RANK', '0')}.pt")


if __name__ == "__main__":
    main()
