"""Streams under several processes: each rank (and loader worker) reads its own part; when the ranks' parts end
unevenly, every rank ends the pass at the same iteration (no hang) and the log says how many batches each left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from conftest import LinearReg
from launch import gloo_group, use_gloo_env
from streams import Counted, Numbered, hf_stream, ids_of, write_shards
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import trainwright as tw
from trainwright.data import Mixture, StreamShard, split_stream

WORLD = 2


def _ids(dataset: Any, workers: int) -> list[int]:
    return [i for b in DataLoader(dataset, batch_size=3, num_workers=workers, collate_fn=ids_of) for i in b]


def test_each_rank_and_worker_reads_its_own_part_of_a_plain_stream() -> None:
    parts = [_ids(StreamShard(Numbered(23), rank, WORLD), workers=2) for rank in range(WORLD)]
    assert set(parts[0]).isdisjoint(parts[1])
    assert sorted(parts[0] + parts[1]) == list(range(23))
    assert sorted(parts[0]) == [i for i in range(23) if i % 4 in (0, 1)]  # rank 0: readers 0 and 1 of 4
    assert len(StreamShard(Numbered(23), 1, WORLD)) == 12  # the largest part, the same on every rank


def test_a_rank_s_part_resumes_from_its_state_under_two_workers() -> None:
    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(StreamShard(Counted(0, 60), 1, WORLD), batch_size=3, num_workers=2, collate_fn=ids_of)

    full = list(loader())
    first = loader()
    head = [b for _, b in zip(range(3), first)]
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    assert sorted(i for b in full for i in b) == [i for i in range(60) if i % 4 in (2, 3)]  # rank 1: readers 2, 3 of 4


def test_a_hugging_face_stream_is_split_by_node(tmp_path: Path) -> None:
    files = write_shards(tmp_path, shards=4, per_shard=5)
    parts = [_ids(split_stream(hf_stream(files), rank, WORLD), workers=0) for rank in range(WORLD)]
    assert set(parts[0]).isdisjoint(parts[1])
    assert sorted(parts[0] + parts[1]) == list(range(20))


class RecordIds(tw.Hook):
    def __init__(self) -> None:
        self.ids: list[list[int]] = []

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        self.ids.append([int(v) for v in data_batch[0][:, 0]])


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    with gloo_group(rank, init_file, WORLD):
        record = RecordIds()
        # 19 samples: rank 0 reads 10 (5 batches of 2), rank 1 reads 9 (4 batches, the odd one dropped)
        t = tw.Trainer(
            model=LinearReg(),
            work_dir=Path(out_dir) / f"rank{rank}",
            train_dataloader=dict(dataset=Numbered(19), batch_size=2, drop_last=True),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
            train_cfg=dict(by_epoch=True, max_epochs=2),
            strategy="ddp",
            custom_hooks=[record],
            default_hooks=dict(checkpoint=None),
            experiment_name="run",
        )
        t.train()
        report: dict[str, Any] = {"iteration": t.progress.iteration, "epoch": t.progress.epoch, "ids": record.ids}
        t.close()
        del t
        mixed = RecordIds()  # a Mixture: each rank draws its own share of both sources
        table = [(torch.tensor([float(i), 0.0, 1.0, 0.0]), torch.tensor([0.1])) for i in range(100, 120)]
        t = tw.Trainer(
            model=LinearReg(),
            work_dir=Path(out_dir) / f"rank{rank}" / "mix",
            train_dataloader=dict(dataset=Mixture([table, Counted()], weights=[1, 1], seed=2), batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=1e-7)),
            train_cfg=dict(by_epoch=False, max_iters=4),
            strategy="ddp",
            custom_hooks=[mixed],
            default_hooks=dict(checkpoint=None),
        )
        t.train()
        report["mixed"] = [i for b in mixed.ids for i in b]
        t.close()
        del t
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_processes_read_disjoint_parts_and_stop_together_when_the_parts_end_unevenly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_gloo_env(monkeypatch, tmp_path)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    assert r0["iteration"] == r1["iteration"] == 8 and r0["epoch"] == r1["epoch"] == 2  # 4 batches per pass, 2 passes
    first = [i for b in r0["ids"][:4] for i in b], [i for b in r1["ids"][:4] for i in b]
    assert first[0] == [0, 2, 4, 6, 8, 10, 12, 14] and first[1] == [1, 3, 5, 7, 9, 11, 13, 15]
    log = "\n".join(p.read_text() for p in (tmp_path / "rank0").rglob("*.log"))
    assert "is a stream read by several processes: Numbered split by rank x loader worker" in log
    assert "Mixture of 2 sources, each rank x loader worker drawing its own share" in log
    assert "it never ends (endless = True), so its end is not agreed" in log  # no all-gather per iteration
    assert log.count("batches left unread: rank 0: 1, rank 1: 0") == 2, log[-3000:]
    mixed = r0["mixed"], r1["mixed"]
    assert set(mixed[0]).isdisjoint(mixed[1]) and all(len(m) == 16 for m in mixed)
    assert {i % 2 for i in mixed[1] if i >= 1000} == {1}  # the stream: every 2nd item from the rank's own on
    assert any(i < 1000 for i in mixed[0]) and any(i >= 1000 for i in mixed[0])
