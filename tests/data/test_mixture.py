"""Mixture: a map-style and a streaming source drawn with weights; stopped, saved and resumed, the samples go on as
an uninterrupted run's (with 0 and 2 loader workers); changed weights at resume warn and continue each
source's position."""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import LinearReg
from streams import Counted, hf_stream, ids_of, write_shards
from torchdata.stateful_dataloader import StatefulDataLoader

import trainwright as tw
from trainwright.data import Mixture
from trainwright.registry import DATASETS

MAP = list(range(100, 120))  # map-style source: ids 100..119


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(tmp_path_factory.mktemp("shards"), shards=4, per_shard=10, first=1000)


def _mixture(shards: list[str], weights: tuple[float, float] = (0.5, 0.5)) -> Mixture:
    return Mixture({"map": MAP, "stream": hf_stream(shards)}, weights=list(weights), seed=3)


def _through_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """The state saved and read back as a checkpoint is: no pickled objects."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)  # type: ignore[no-any-return]


def _batches(loader: StatefulDataLoader, n: int) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_mixture_stopped_and_resumed_gives_the_uninterrupted_samples(shards: list[str], workers: int) -> None:
    def loader(mixture: Mixture) -> StatefulDataLoader:
        return StatefulDataLoader(mixture, batch_size=4, num_workers=workers, collate_fn=ids_of)

    full = _batches(loader(_mixture(shards)), 14)
    first = loader(_mixture(shards))
    head = _batches(first, 5)
    state = _through_checkpoint(first.state_dict())
    del first  # the run is gone; a new process would build everything again
    resumed = loader(_mixture(shards))
    resumed.load_state_dict(state)
    assert head + _batches(resumed, 9) == full
    ids = [i for b in full for i in b]
    assert {i for i in ids if i < 1000} <= set(MAP) and any(i >= 1000 for i in ids)  # both sources drawn
    assert len([i for i in ids if i >= 1000]) == len({i for i in ids if i >= 1000})  # the stream read once


def test_changed_weights_at_resume_warn_and_go_on_from_each_sources_position(shards: list[str]) -> None:
    old = iter(_mixture(shards))
    reference = [next(old) for _ in range(60)]  # the old run, uninterrupted
    saved = _mixture(shards)
    it = iter(saved)
    head = [next(it) for _ in range(10)]
    state = _through_checkpoint(saved.state_dict())
    resumed = _mixture(shards, weights=(0.9, 0.1))
    with pytest.warns(UserWarning, match=r"weights changed at resume from \[0.5, 0.5\] to \[0.9, 0.1\]"):
        resumed.load_state_dict(state)
    rest = iter(resumed)
    tail = [next(rest) for _ in range(20)]

    def of(samples: list[Any], stream: bool) -> list[int]:
        return [i for i in map(_id, samples) if (i >= 1000) == stream]

    for stream in (False, True):  # each source goes on where it was: its samples continue the old run's
        done, after = of(head, stream), of(tail, stream)
        assert of(reference, stream)[: len(done) + len(after)] == done + after
    assert len(of(tail, False)) > len(of(tail, True))  # drawn with the new weights


def _id(sample: Any) -> int:
    return int(sample["id"]) if isinstance(sample, dict) else int(sample)


def test_weights_are_the_draw_frequencies_and_a_config_builds_the_same_mixture() -> None:
    a, b = list(range(50)), list(range(1000, 1050))
    built = DATASETS.build(dict(type="Mixture", sources=[a, b], weights=[4, 1], seed=7))
    direct = Mixture([a, b], weights=[4, 1], seed=7)
    x, y = iter(built), iter(direct)
    draws = [next(x) for _ in range(2000)]
    assert draws == [next(y) for _ in range(2000)]
    share = sum(d < 1000 for d in draws) / len(draws)
    assert 0.77 < share < 0.83
    first_pass = [d for d in draws if d < 1000][:50]
    assert sorted(first_pass) == a  # a map-style source: every sample once per pass


def test_mixture_refuses_wrong_weights_and_another_set_of_sources() -> None:
    with pytest.raises(ValueError, match="2 sources but 3 weights"):
        Mixture([[1], [2]], weights=[1, 1, 1])
    with pytest.raises(ValueError, match="must be >= 0 and not all 0"):
        Mixture([[1], [2]], weights=[0, 0])
    state = Mixture([[1], [2]], weights=[1, 1]).state_dict()
    with pytest.raises(ValueError, match="resume with the same sources"):
        Mixture([[1], [2], [3]], weights=[1, 1, 1]).load_state_dict(state)


def test_a_stream_without_state_is_read_past_on_resume(tmp_path: Path) -> None:
    class Plain(torch.utils.data.IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(1000, 1100))

    def mixture() -> Mixture:
        return Mixture([MAP, Plain()], weights=[1, 1], seed=0)

    full = iter(mixture())
    reference = [next(full) for _ in range(30)]
    first = mixture()
    it = iter(first)
    head = [next(it) for _ in range(12)]
    resumed = mixture()
    resumed.load_state_dict(_through_checkpoint(first.state_dict()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rest = iter(resumed)
        tail = [next(rest) for _ in range(18)]
    assert head + tail == reference
    assert any("has no state_dict(): resuming reads past" in str(w.message) for w in caught)


class RecordIds(tw.Hook):
    def __init__(self) -> None:
        self.ids: list[list[int]] = []

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        self.ids.append([int(v) for v in data_batch[0][:, 0]])


def test_a_trainer_resumes_a_mixture_from_its_checkpoint(tmp_path: Path) -> None:
    table = [(torch.tensor([float(i), 0.0, 1.0, 0.0]), torch.tensor([0.1])) for i in MAP]

    def train(work: Path, max_iters: int, resume: bool) -> list[list[int]]:
        record = RecordIds()
        t = tw.Trainer(
            model=LinearReg(),
            work_dir=work,
            train_dataloader=dict(dataset=Mixture([table, Counted()], weights=[1, 2], seed=5), batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=1e-7)),  # inputs up to 1100
            train_cfg=dict(by_epoch=False, max_iters=max_iters),
            default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1, by_epoch=False)),
            custom_hooks=[record],
            resume=resume,
            log_level="WARNING",
        )
        t.train()
        t.close()
        return record.ids

    full = train(tmp_path / "full", 7, False)
    assert train(tmp_path / "cut", 3, False) + train(tmp_path / "cut", 7, True) == full
    ids = [i for b in full for i in b]
    streamed = [i for i in ids if i >= 1000]
    assert streamed == list(range(1000, 1000 + len(streamed)))  # the stream went on from its state: nothing twice


def test_find_lr_puts_a_mixture_read_in_this_process_back_where_it_was(tmp_path: Path) -> None:
    """No loader workers: the mixture in this process keeps its position itself; the range test's batches must not
    move it, so training after ``find_lr`` reads the samples a run without it reads."""
    table = [(torch.tensor([float(i), 0.0, 1.0, 0.0]), torch.tensor([0.1])) for i in MAP]

    def train(work: Path, tune: bool) -> list[list[int]]:
        record = RecordIds()
        t = tw.Trainer(
            model=LinearReg(),
            work_dir=work,
            train_dataloader=dict(dataset=Mixture([table, Counted()], weights=[1, 2], seed=5), batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=1e-7)),
            train_cfg=dict(by_epoch=False, max_iters=4),
            custom_hooks=[record],
            log_level="WARNING",
        )
        if tune:
            assert len(t.find_lr(num_steps=5, min_lr=1e-9, max_lr=1e-7).lrs) == 5
        t.train()
        t.close()
        return record.ids

    assert train(tmp_path / "tuned", True) == train(tmp_path / "plain", False)
