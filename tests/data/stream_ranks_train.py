"""One 2-process (gloo) training run over a Hugging Face stream, for tests/data/test_stream_ranks_resume.py.

``torchrun --nproc_per_node=2 stream_ranks_train.py WORK MAX_ITERS KILL_AT TAG [--resume]``: JSON-lines shards under
``WORK/shards`` read as a Hugging Face streaming dataset (``train_dataloader=dict(...)``, 2 loader workers), split by
rank; every sample the dataset yields appends its id to ``WORK/reads-TAG-rankR.txt``; every iteration appends
``{"it", "ids"}`` to ``WORK/trained-TAG-rankR.jsonl``; a checkpoint is saved every iteration; after iteration KILL_AT's
checkpoint rank 1 kills itself with SIGKILL (0: never). At the end rank 0 saves the model's weights to
``WORK/weights-TAG.pt``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

import trainwright as tw


def count_read(example: dict[str, Any], reads: str) -> dict[str, Any]:
    """Record that the dataset produced this sample (in whichever process reads it)."""
    with open(reads, "a") as f:
        f.write(f"{example['id']}\n")
    return example


class Net(tw.BaseModel):
    """A regression of cos(id) on features of the id, with dropout (so the random streams matter)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.fc = nn.Linear(2, 16)
        self.out = nn.Linear(16, 1)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        self.drop = nn.Dropout(0.5)

    def forward(self, id: torch.Tensor, mode: str = "tensor") -> Any:  # noqa: A002
        t = id.float()
        x = torch.stack([t / 40, torch.sin(t)], 1)
        pred = self.out(self.drop(torch.relu(self.fc(x)))).squeeze(1)
        return {"loss": ((pred - torch.cos(t)) ** 2).mean()} if mode == "loss" else pred


class Record(tw.Hook):
    """Appends each iteration's sample ids; rank 1 kills its process after iteration ``kill_at``'s checkpoint."""

    priority = "LOWEST"  # after the checkpoint hook

    def __init__(self, out: Path, kill_at: int, rank: int) -> None:
        self.out, self.kill_at, self.rank = out, kill_at, rank

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        it = trainer.progress.iteration
        with open(self.out, "a") as f:
            f.write(json.dumps({"it": it, "ids": data_batch["id"].tolist()}) + "\n")
        if it == self.kill_at and self.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    import datasets

    work, max_iters, kill_at, tag = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    rank = int(os.environ["RANK"])
    files = sorted(str(p) for p in (work / "shards").glob("*.jsonl"))
    ds = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    ds = ds.map(count_read, fn_kwargs={"reads": str(work / f"reads-{tag}-rank{rank}.txt")})  # in the loader workers
    trainer = tw.Trainer(
        model=Net(),
        work_dir=work,
        train_dataloader=dict(dataset=ds, batch_size=4, num_workers=2),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        strategy="ddp",
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1, by_epoch=False, max_keep_ckpts=2)),
        custom_hooks=[Record(work / f"trained-{tag}-rank{rank}.jsonl", kill_at, rank)],
        randomness=dict(seed=3),
        resume="--resume" in sys.argv,
        experiment_name="run",
    )
    trainer.train()
    if rank == 0:
        torch.save({k: v.clone() for k, v in trainer.unwrapped_model.state_dict().items()}, work / f"weights-{tag}.pt")
    trainer.close()


if __name__ == "__main__":
    main()
