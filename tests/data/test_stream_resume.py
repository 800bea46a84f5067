"""Streams resume from their own state: killed with SIGKILL and resumed, the samples trained, their order and the
weights are an uninterrupted run's, and the dataset is not read again up to the checkpoint (no replay)."""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from forked import ForkedRun, ForkServer
from torch.utils.data import DataLoader, IterableDataset

from trainwright.checkpoint.stateful import make_safe
from trainwright.data.loader import build_dataloader

SCRIPT = Path(__file__).with_name("stream_train.py")
TIMEOUT = 240


def _shards(work: Path) -> None:
    """4 JSON-lines shards of 10 samples each: ids 0..39."""
    (work / "shards").mkdir(parents=True)
    for s in range(4):
        (work / "shards" / f"s{s}.jsonl").write_text(
            "".join(json.dumps({"id": i}) + "\n" for i in range(s * 10, s * 10 + 10))
        )


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """The runs' processes are forked from one that imported torch once (each run is still a process of its own)."""
    server = ForkServer(dict(os.environ), tmp_path_factory.mktemp("forks") / "server.log")
    yield server
    server.close()


def _start(
    forks: ForkServer, source: str, work: Path, max_iters: int, kill_at: int, tag: str, resume: bool = False
) -> ForkedRun:
    args = [source, str(work), str(max_iters), str(kill_at), tag, *(["--resume"] if resume else [])]
    return forks.start(SCRIPT, args, stderr_to_stdout=True)


def _finish(p: Any, killed: bool) -> str:
    out, _ = p.communicate(timeout=TIMEOUT)
    assert p.returncode == (-9 if killed else 0), out[-3000:]
    return str(out)


def _trained(work: Path) -> dict[int, list[int]]:
    """Iteration → sample ids, the last run's record of an iteration winning (a killed run's later iterations are
    trained again)."""
    return {r["it"]: r["ids"] for r in map(json.loads, (work / "trained.jsonl").read_text().splitlines())}


def _reads(work: Path, tag: str) -> Counter[int]:
    path = work / f"reads-{tag}.txt"
    return Counter(int(x) for x in path.read_text().split()) if path.exists() else Counter()


def _chain(
    forks: ForkServer, tmp_path: Path, source: str, max_iters: int, kills: list[int]
) -> tuple[Path, Path, list[str]]:
    """An uninterrupted run (in parallel) and one killed after each iteration of ``kills``, resumed each time."""
    ref, work = tmp_path / "ref", tmp_path / "run"
    for d in (ref, work):
        _shards(d)
    reference = _start(forks, source, ref, max_iters, 0, "ref")
    logs = []
    for i, k in enumerate([*kills, 0]):
        logs.append(_finish(_start(forks, source, work, max_iters, k, f"seg{i}", resume=i > 0), killed=k > 0))
    _finish(reference, killed=False)
    return ref, work, logs


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = torch.load(a / "weights.pt"), torch.load(b / "weights.pt")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # dropout included: the random streams are the same


@pytest.mark.slow
@pytest.mark.multiprocess
def test_hf_streaming_shards_with_two_workers_resume_mid_pass_without_reading_again(
    tmp_path: Path, forks: ForkServer
) -> None:
    """A Hugging Face streaming dataset over local JSON-lines shards handed over in a dict, 2 loader workers, training
    by iterations (no ``__len__``; 10 batches a pass), accumulation of 3: killed after iteration 7 (inside an
    accumulation window) and resumed: the dataset reads exactly the samples of iterations 8-10 again, each once."""
    pytest.importorskip("datasets")
    ref, work, logs = _chain(forks, tmp_path, "hf", 10, [7])
    trained = _trained(ref)
    assert sorted(trained) == list(range(1, 11))
    assert _trained(work) == trained
    _same_weights(ref, work)
    assert _reads(work, "seg1") == Counter(i for it in (8, 9, 10) for i in trained[it])
    assert "consuming" not in logs[1] and "reading again" not in logs[1]  # no replay, no warning of one


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_stateful_loader_passed_in_over_an_endless_plain_stream_resumes_exactly_at_pass_boundaries(
    tmp_path: Path, forks: ForkServer
) -> None:
    """A ``StatefulDataLoader`` passed in, over a plain ``IterableDataset`` with ``state_dict()`` and no ``__len__``,
    2 workers, ``by_epoch=False`` (10 batches a pass), accumulation of 3: killed after iteration 10 (a pass's last
    batch, inside an accumulation window), resumed and killed after 11 (the next pass's first batch), resumed again
    (a resumed run's resume) to the end; the run logs an ETA from max_iters."""
    ref, work, logs = _chain(forks, tmp_path, "plain", 14, [10, 11])
    assert _trained(work) == _trained(ref)
    assert sorted(_trained(ref)) == list(range(1, 15))
    _same_weights(ref, work)
    for seg in (1, 2):
        reads = _reads(work, f"seg{seg}")
        assert max(reads.values()) == 1, reads  # a resumed run reads each sample once: the pass is not read again
    assert "Iter(train) [14/14]" in logs[-1] and "eta: " in logs[-1]


class Counted(IterableDataset):
    """0..11 in batches of the loader; ``state_dict()`` is how many it yielded (one pass)."""

    def __init__(self) -> None:
        self.done, self._start, self.reads = 0, 0, Counter[int]()

    def __iter__(self) -> Any:
        start, self._start = self._start, 0
        self.done = start
        for i in range(start, 12):
            self.done += 1
            self.reads[i] += 1
            yield i

    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._start = int(state["done"])


def test_a_dataloader_over_a_dataset_with_state_is_restored_not_replayed_and_leaves_the_global_rng() -> None:
    """A plain ``DataLoader`` handed over is rebuilt as a ``StatefulDataLoader``; its state (pickle-free) restores the
    stream, the dataset reads nothing twice, and iterating draws nothing from the global RNG."""
    a = build_dataloader(DataLoader(Counted(), batch_size=3))
    assert a.stateful and a.length is None
    rng = torch.get_rng_state()
    it = iter(a)
    head = [next(it).tolist() for _ in range(2)]
    assert torch.equal(torch.get_rng_state(), rng)  # the loader's base seed comes from its own generator
    state, order = make_safe(a.stream_state()), a.state_dict()
    b = build_dataloader(DataLoader(Counted(), batch_size=3))
    b.load_state_dict(order)
    b.load_stream_state(state)
    rest = [x.tolist() for x in b]
    assert head + rest == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert b.loader.dataset.reads == Counter(range(6, 12))  # nothing before the checkpoint read again
    assert b.epoch == 1 and b.position == 0


def test_stateful_false_keeps_a_plain_loader_and_the_replay_warning_names_the_remedy() -> None:
    a = build_dataloader(dict(dataset=Counted(), batch_size=3, stateful=False))
    assert not a.stateful
    it = iter(a)
    next(it)
    b = build_dataloader(dict(dataset=Counted(), batch_size=3, stateful=False))
    b.load_state_dict(a.state_dict())
    b.load_stream_state(a.stream_state())
    rng = torch.get_rng_state()
    with pytest.warns(UserWarning, match=r"consuming 1 batches.*state_dict\(\).*stateful=True"):
        assert [x.tolist() for x in b] == [[3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert torch.equal(torch.get_rng_state(), rng)  # the replay does not shift the global random stream (dropout)


def test_an_endless_stream_trains_by_iterations_and_is_refused_by_epochs(trainer_factory: Any) -> None:
    class Endless(IterableDataset):
        def __iter__(self) -> Any:
            g = torch.Generator().manual_seed(0)
            while True:
                yield torch.randn(4, generator=g), torch.randn(1, generator=g)

    t = trainer_factory(
        train_dataloader=dict(dataset=Endless(), batch_size=2),
        train_cfg=dict(by_epoch=False, max_iters=5),
        custom_hooks=[dict(type="EMAHook", begin_iter=2)],  # a hook that counts in epochs too: by iterations here
    )
    t.train()
    assert t.progress.iteration == 5
    with pytest.raises(TypeError, match=r"(?s)has no __len__.*by_epoch=False, max_iters=N"):
        trainer_factory(train_dataloader=dict(dataset=Endless(), batch_size=2)).train()


def test_under_several_processes_each_rank_restores_its_own_stream_and_another_world_size_reads_again() -> None:
    """The ``data_state`` piece of rank 1 of 2: a save holds every rank's state (gathered), a resume takes its own;
    a checkpoint of 2 processes resumed by 3 restores none, with a warning naming both counts."""
    from trainwright.data.stream_state import StreamState

    loaders = [build_dataloader(DataLoader(Counted(), batch_size=3)) for _ in range(2)]
    its = [iter(x) for x in loaders]
    next(its[0])
    next(its[1]), next(its[1])  # the ranks stand at different points of their streams
    states = [x.stream_state() for x in loaders]
    saved = StreamState(loaders[1], lambda own: [states[0], own], rank=1, world_size=2).state_dict()
    assert saved["per_rank"][1] == states[1] and saved["per_rank"][0] == states[0]
    resumed = build_dataloader(DataLoader(Counted(), batch_size=3))
    resumed.load_state_dict(loaders[1].state_dict())
    StreamState(resumed, lambda own: [own, own], rank=1, world_size=2).load_state_dict(make_safe(saved))
    assert [x.tolist() for x in resumed] == [[6, 7, 8], [9, 10, 11]]  # rank 1's stream, from its own position
    other = build_dataloader(DataLoader(Counted(), batch_size=3))
    other.load_state_dict(loaders[1].state_dict())
    with pytest.warns(UserWarning, match=r"stream positions of 2 process\(es\), this run has 3"):
        StreamState(other, lambda own: [own] * 3, rank=1, world_size=3).load_state_dict(saved)
    with pytest.warns(UserWarning, match="consuming 2 batches"):
        assert [x.tolist() for x in other] == [[6, 7, 8], [9, 10, 11]]


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's, when the test builds its loader
def test_a_stateful_loader_over_map_style_data_resumes_by_the_sampler_as_a_dataloader() -> None:
    """torchdata builds its own samplers in place of torch's: they are read as torch's, so the order is the seeded
    one (the same as a ``DataLoader``'s with the same seed) and a mid-epoch resume skips to the position."""
    from torch.utils.data import TensorDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = TensorDataset(torch.arange(10))
    ref = [x[0].tolist() for x in build_dataloader(DataLoader(ds, batch_size=2, shuffle=True), seed=1)]
    a = build_dataloader(StatefulDataLoader(ds, batch_size=2, shuffle=True), seed=1)
    b = build_dataloader(StatefulDataLoader(ds, batch_size=2, shuffle=True), seed=1)
    head = [x[0].tolist() for x in itertools.islice(iter(a), 2)]
    b.load_state_dict(a.state_dict())
    assert head + [x[0].tolist() for x in b] == ref


def test_a_hugging_face_map_style_dataset_handed_over_resumes_mid_epoch_by_the_sampler() -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"id": list(range(10))})
    ref = [x["id"].tolist() for x in build_dataloader(dict(dataset=ds, batch_size=3, shuffle=True), seed=2)]
    a = build_dataloader(dict(dataset=ds, batch_size=3, shuffle=True), seed=2)
    head = [x["id"].tolist() for x in itertools.islice(iter(a), 2)]
    b = build_dataloader(dict(dataset=ds, batch_size=3, shuffle=True), seed=2)
    b.load_state_dict(a.state_dict())
    assert not b.stateful and head + [x["id"].tolist() for x in b] == ref
    assert sorted(i for batch in ref for i in batch) == list(range(10))


class Pairs(IterableDataset):
    """A stream of 8 regression samples with ``__len__`` and ``state_dict()`` (the position in the pass)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x, self.w = torch.randn(8, 4, generator=g), torch.randn(4, 1, generator=g)
        self.done, self._start = 0, 0

    def __len__(self) -> int:
        return 8

    def __iter__(self) -> Any:
        start, self._start = self._start, 0
        self.done = start
        for i in range(start, 8):
            self.done += 1
            yield self.x[i], self.x[i] @ self.w

    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._start = int(state["done"])


def test_a_stream_by_epochs_resumes_exactly_at_an_epochs_last_and_first_batch_and_twice(tmp_path: Path) -> None:
    """Epochs of 4 batches over a stream with ``__len__`` and state, accumulation of 3: resumed from the checkpoint at
    epoch 1's last batch (iteration 4, inside an accumulation window), at epoch 2's first (5), and from a checkpoint a
    resumed run wrote (6): every run ends with the uninterrupted run's weights, bitwise."""
    import trainwright as tw
    from tests.conftest import LinearReg

    def run(work: Path, resume: Any = False) -> dict[str, torch.Tensor]:
        t = tw.Trainer(
            model=LinearReg(),
            work_dir=work,
            train_dataloader=dict(dataset=Pairs(), batch_size=2),
            train_cfg=dict(by_epoch=True, max_epochs=2),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1), accumulative_counts=3),
            default_hooks=dict(checkpoint=dict(interval=1, by_epoch=False)),
            randomness=dict(seed=0),
            log_level="WARNING",
            resume=resume,
        )
        with t:
            t.train()
            return {k: v.clone() for k, v in t.unwrapped_model.state_dict().items()}

    ref = run(tmp_path / "ref")
    ckpts = tmp_path / "ref" / "checkpoints"
    for name, at in (("last", 4), ("first", 5)):
        got = run(tmp_path / name, resume=str(ckpts / f"iter_{at}.pth"))
        assert all(torch.equal(ref[k], got[k]) for k in ref), name
    again = run(tmp_path / "again", resume=str(tmp_path / "last" / "checkpoints" / "iter_6.pth"))
    assert all(torch.equal(ref[k], again[k]) for k in ref)
