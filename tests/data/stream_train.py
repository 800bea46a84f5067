"""One training run over a stream, for tests/data/test_stream_resume.py (run as a subprocess, killed with SIGKILL).

``python stream_train.py SOURCE WORK MAX_ITERS KILL_AT TAG [--resume]``: SOURCE is ``hf`` (JSON-lines shards under
``WORK/shards`` read as a Hugging Face streaming dataset, ``train_dataloader=dict(...)`` with 2 workers) or ``plain`` (a
plain ``IterableDataset`` with ``state_dict``, no ``__len__``, in a ``StatefulDataLoader`` passed in, 2 workers). Every
iteration appends ``{"it", "ids"}`` to ``WORK/trained.jsonl``; every sample the dataset yields appends its id to
``WORK/reads-TAG.txt`` (from whichever process reads it); a checkpoint is saved every iteration; after iteration
KILL_AT's checkpoint the process kills itself with SIGKILL (0: never). At the end the model's weights go to
``WORK/weights.pt``.
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
from torch.utils.data import IterableDataset, get_worker_info

import trainwright as tw

N = 40  # samples per pass
SHARDS = 4


def count_read(example: dict[str, Any], reads: str) -> dict[str, Any]:
    """Record that the dataset produced this sample (in whichever process reads it)."""
    with open(reads, "a") as f:
        f.write(f"{example['id']}\n")
    return example


class PlainStream(IterableDataset):
    """Samples ``0..N-1`` split among loader workers by shard; ``state_dict()`` is the position in the worker's part."""

    def __init__(self, reads: str) -> None:
        self.reads = reads
        self.done = 0  # samples of this worker's part already yielded
        self._start = 0  # where the next pass starts (set by load_state_dict; one pass only)

    def __iter__(self) -> Any:
        info = get_worker_info()
        wid, workers = (0, 1) if info is None else (info.id, info.num_workers)
        mine = [i for i in range(N) if i % workers == wid]
        start, self._start = self._start, 0
        self.done = start
        for i in mine[start:]:
            self.done += 1
            yield count_read({"id": i}, self.reads)

    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._start = int(state["done"])


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
        x = torch.stack([t / N, torch.sin(t)], 1)
        pred = self.out(self.drop(torch.relu(self.fc(x)))).squeeze(1)
        return {"loss": ((pred - torch.cos(t)) ** 2).mean()} if mode == "loss" else pred


class Record(tw.Hook):
    """Appends each iteration's sample ids; kills the process after iteration ``kill_at``'s checkpoint."""

    priority = "LOWEST"  # after the checkpoint hook

    def __init__(self, out: Path, kill_at: int) -> None:
        self.out, self.kill_at = out, kill_at

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        it = trainer.progress.iteration
        with open(self.out, "a") as f:
            f.write(json.dumps({"it": it, "ids": data_batch["id"].tolist()}) + "\n")
        if it == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def loader(source: str, work: Path, tag: str) -> Any:
    reads = str(work / f"reads-{tag}.txt")
    if source == "hf":
        import datasets

        files = sorted(str(p) for p in (work / "shards").glob("*.jsonl"))
        ds = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
        ds = ds.map(count_read, fn_kwargs={"reads": reads})
        return dict(dataset=ds, batch_size=4, num_workers=2)
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(PlainStream(reads), batch_size=4, num_workers=2)


def main() -> None:
    source, work, max_iters, kill_at, tag = (
        sys.argv[1],
        Path(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
        sys.argv[5],
    )
    trainer = tw.Trainer(
        model=Net(),
        work_dir=work,
        train_dataloader=loader(source, work, tag),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1), accumulative_counts=3),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1, by_epoch=False, max_keep_ckpts=2)),
        custom_hooks=[Record(work / "trained.jsonl", kill_at)],
        randomness=dict(seed=3),
        resume="--resume" in sys.argv,
        log_level="INFO",
    )
    trainer.train()
    torch.save({k: v.clone() for k, v in trainer.unwrapped_model.state_dict().items()}, work / "weights.pt")
    trainer.close()


if __name__ == "__main__":
    main()
