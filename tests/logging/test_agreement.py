"""Stop, NaN and write decisions, and the logged numbers, agree on every process at a fixed cadence.

Two "processes" are two threads; their collective is a strategy's ``all_gather`` that meets the
other thread's call of the same collective at a barrier and stacks both tensors. A rank that made
a collective the other did not make would break the barrier (a hang under real processes) and
fail the test.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import LinearReg, regression_set

import trainwright as tw
from trainwright.logging import Agreement, LoggedValuesDisagreeError, MetricStore, Writer
from trainwright.strategies.single_device import SingleDeviceStrategy


class FakeGather:
    """``all_gather`` for ``n`` threads: each call waits for every thread's call of the same collective and stacks
    their tensors."""

    def __init__(self, n: int = 2) -> None:
        self.barrier = threading.Barrier(n, timeout=20)
        self.sent: list[list[torch.Tensor]] = [[] for _ in range(n)]

    def for_rank(self, rank: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def gather(t: torch.Tensor) -> torch.Tensor:
            i = len(self.sent[rank])
            self.sent[rank].append(t.clone())
            self.barrier.wait()  # every thread has sent its tensor of call i
            sizes = [sent[i].shape for sent in self.sent]
            if len(set(sizes)) > 1:  # gloo aborts the process here ("Received data size doesn't match expected size")
                raise AssertionError(
                    f"all_gather of tensors of different sizes {sizes}: a real collective aborts or hangs"
                )
            return torch.stack([sent[i] for sent in self.sent])

        return gather


def _run_ranks(fns: list[Callable[[], Any]]) -> list[Any]:
    """Run one function per rank in threads; return each one's result or exception."""
    results: list[Any] = [None] * len(fns)

    def target(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            results[i] = e

    threads = [threading.Thread(target=target, args=(i,)) for i in range(len(fns))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads), "a rank hangs"
    return results


def _store(gather: FakeGather, rank: int) -> MetricStore:
    return MetricStore(agreement=Agreement(gather.for_rank(rank)))


def test_flushed_numbers_are_reduced_over_the_processes() -> None:
    """detectron2 semantics: every rank's buffers hold the mean loss and the slowest rank's data_time, per iteration."""
    gather = FakeGather()

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            store = _store(gather, r)
            store.start_clock(0.0)
            end = 0.0
            for it in range(1, 5):
                wait = 0.1 * it if r == 0 else 0.05  # rank 0's loader is slower from iteration 2 on
                store.record(
                    it,
                    {"loss": torch.tensor(float(it + 10 * r)), "acc": torch.tensor(float(r))},
                    end + wait,
                    end + wait + 1.0,
                )
                end += wait + 1.0
            store.flush()
            return {name: store.get(name).history() for name in ("loss", "acc", "data_time", "time")}

        return run

    out0, out1 = _run_ranks([rank(0), rank(1)])
    assert out0 == out1  # the same numbers on every rank
    assert out0["loss"] == ([1, 2, 3, 4], [6.0, 7.0, 8.0, 9.0])  # mean of it and it + 10
    assert out0["acc"][1] == [0.5] * 4
    assert out0["data_time"][1] == pytest.approx([0.1, 0.2, 0.3, 0.4])  # max over ranks
    assert out0["time"][1] == pytest.approx(
        [(1.1 + 1.05) / 2, (1.2 + 1.05) / 2, (1.3 + 1.05) / 2, (1.4 + 1.05) / 2]
    )  # mean
    assert [len(s) for s in gather.sent] == [
        2,
        2,
    ]  # the first flush: its decisions, then its numbers at the count agreed there


def test_a_nan_on_one_rank_raises_on_both_at_the_same_flush_naming_the_iteration() -> None:
    gather = FakeGather()

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            store = _store(gather, r)
            for it in range(1, 9):
                store.record(it, {"loss": torch.tensor(float("nan") if (r == 1 and it == 7) else 1.0)}, None, None)
                if it % 4 == 0:
                    try:
                        store.flush()
                    except FloatingPointError as e:
                        return it, str(e)
            return None, ""

        return run

    (at0, msg0), (at1, msg1) = _run_ranks([rank(0), rank(1)])
    assert at0 == at1 == 8
    assert "at iteration 7 on rank 1; that process's error names its losses" in msg0 and "nonfinite_loss='skip'" in msg0
    assert "at iteration 7 on rank 1: {'loss': nan}" in msg1


def test_processes_logging_different_names_get_a_clear_error() -> None:
    gather = FakeGather()

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            store = _store(gather, r)
            if r == 0:  # two values on each rank, under other names
                store.record(1, {"loss": torch.tensor(1.0)}, None, None)
                store.record(2, {"loss": torch.tensor(1.0)}, None, None)
            else:
                store.record(1, {"loss": torch.tensor(1.0), "extra": torch.tensor(2.0)}, None, None)
            store.flush()

        return run

    e0, e1 = _run_ranks([rank(0), rank(1)])
    assert isinstance(e0, LoggedValuesDisagreeError) and isinstance(e1, LoggedValuesDisagreeError)
    assert "log the same names" in str(e0) and "extra" in str(e1)


def test_processes_logging_different_numbers_of_values_get_the_clear_error_not_a_collective_of_unequal_sizes() -> None:
    """An extra loss on one rank only (e.g. an auxiliary loss of some batches): every rank raises, naming the ranks
    and counts."""
    gather = FakeGather()

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            store = _store(gather, r)
            for it in (1, 2):  # one flush agrees on the size of the numbers
                store.record(it, {"loss": torch.tensor(1.0)}, None, None)
            store.flush()
            for it in (3, 4):  # the next: rank 1 logs one value more
                extra = {"loss_aux": torch.tensor(0.5)} if r == 1 and it == 4 else {}
                store.record(it, {"loss": torch.tensor(1.0), **extra}, None, None)
            store.flush()

        return run

    e0, e1 = _run_ranks([rank(0), rank(1)])
    for e in (e0, e1):
        assert isinstance(e, LoggedValuesDisagreeError), e
        assert e.raised_on_every_rank  # the ranks stay together: each names the others in its own log
        assert "rank(s) [1]" in str(e) and "log the same names" in str(e)
    assert "loss_aux:1" in str(e1) and "loss_aux" not in str(e0)


def test_a_changed_count_of_values_is_agreed_and_reduced_on_every_rank() -> None:
    """Flushes of different lengths (the epoch's last flush, a new name on every rank): the numbers are still
    averaged over the ranks."""
    gather = FakeGather()

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            store = _store(gather, r)
            means = []
            for its in ((1, 2), (3, 4, 5), (6,)):
                for it in its:
                    store.record(it, {"loss": torch.tensor(float(r + it))}, None, None)
                store.flush()
                means.append(store.get("loss").current())
            return means

        return run

    m0, m1 = _run_ranks([rank(0), rank(1)])
    assert m0 == m1 == [2.5, 5.5, 6.5]  # each iteration's loss is the mean of rank 0's (it) and rank 1's (it + 1)


def test_one_process_decides_at_once_without_a_collective() -> None:
    agreement = Agreement()
    assert agreement.local
    agreement.propose_stop()
    assert agreement.stop  # nothing to agree on
    store = MetricStore(agreement=agreement)
    agreement.propose_write()
    store.flush(agree=True)
    assert agreement.write
    store.flush(agree=True)
    assert not agreement.write  # a write is decided per exchange
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        Agreement(every=0)


class Rank(SingleDeviceStrategy):
    """A one-process strategy playing rank ``r`` of ``world`` (its collectives through a :class:`FakeGather`),
    counting them."""

    def __init__(self, r: int, gather: Callable[[torch.Tensor], torch.Tensor] | None, world: int = 2) -> None:
        super().__init__(device="cpu")
        self._r = r
        self._world = world
        self._gather = gather
        self.trainer: Any = None
        self.gathered_at: list[int] = []  # the iterations collectives were made at

    @property
    def rank(self) -> int:
        return self._r

    @property
    def world_size(self) -> int:
        return self._world

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self.gathered_at.append(self.trainer.progress.iteration)
        return self._gather(tensor) if self._gather is not None else super().all_gather(tensor)


class NaNAt(LinearReg):
    def __init__(self, at: int | None) -> None:
        super().__init__()
        self.at = at
        self.calls = 0

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = super().forward(x, y, mode)
        if mode == "loss" and self.training:
            self.calls += 1
            if self.calls == self.at:
                out = {"loss": out["loss"] * float("nan")}
        return out


class StopAt(tw.Hook):
    """Proposes a stop (as a preemption signal's handler does) before iteration ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def before_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None) -> None:
        if trainer.progress.iteration + 1 == self.at:
            trainer.agreement.propose_stop()


class WrittenAt(Writer):
    """Notes the iteration at which each training line reached the writers."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.written: list[tuple[int, int]] = []  # (iteration of the line, iteration it was written at)

    def write_train(self, records: list[dict[str, Any]], lines: Any) -> None:
        self.written += [(r["iter"], self.trainer.progress.iteration) for r in records]


def _two_trainers(
    trainer_factory: Any,
    tmp_path: Any,
    flush_secs: tuple[float, float],
    nan_at: tuple[int | None, int | None] = (None, None),
    stop_at: tuple[int | None, int | None] = (None, None),
    every: int = 4,
) -> tuple[list[tw.Trainer], WrittenAt]:
    gather = FakeGather()
    trainers = []
    written = WrittenAt()
    for r in (0, 1):
        strategy = Rank(r, gather.for_rank(r))
        t = trainer_factory(
            model=NaNAt(nan_at[r]),
            work_dir=tmp_path / f"rank{r}",
            dataset=regression_set(40),
            batch_size=4,
            strategy=strategy,
            train_cfg=dict(by_epoch=True, max_epochs=2),
            default_hooks=dict(checkpoint=None, logger=dict(interval=2, flush_secs=flush_secs[r])),
            custom_hooks=[StopAt(stop_at[r])] if stop_at[r] else None,
            writers=["jsonl", written],
            log_level="INFO",
        )
        strategy.trainer = t
        if r == 0:
            written.trainer = t
        t.agreement.every = every
        trainers.append(t)
    return trainers, written


def test_trainers_with_different_clocks_agree_at_the_cadence_only(trainer_factory: Any, tmp_path: Any) -> None:
    """Rank 0's clock always says "write now" (flush_secs=0), rank 1's never: collectives at the agreement points and
    epoch ends only."""
    (t0, t1), written = _two_trainers(trainer_factory, tmp_path, flush_secs=(0.0, 3600.0))
    assert _run_ranks([t0.train, t1.train]) == [t0.unwrapped_model, t1.unwrapped_model]
    # 40 samples sharded over 2 ranks: 5 iterations per epoch; lines every 2 counted within the epoch (mmengine's):
    # 2, 4, the epoch's last (5), 7, 9, 10.
    # Agreement points every 4 iterations (4, 8); the epoch ends (5, 10) flush the rows since: no collective elsewhere.
    # Each point covers another count of iterations than the one before (4, 1, 3, 2): its numbers follow in a second
    # collective.
    # After each epoch's hooks one more: did a hook ask for a stop (trainer.should_stop) on some rank?
    assert t0.strategy.gathered_at == t1.strategy.gathered_at == [4, 4, 5, 5, 5, 8, 8, 10, 10, 10]  # type: ignore[attr-defined]
    # Rank 0's proposals are agreed at the points, which write the held lines; the epoch ends write theirs.
    assert written.written == [(2, 4), (4, 4), (5, 5), (7, 8), (9, 10), (10, 10)]
    assert not (t1.run_dir / "metrics.jsonl").exists()
    lines = [json.loads(line) for line in (t0.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["iter"] for line in lines] == [2, 4, 5, 7, 9, 10]
    own = [t.metric_store.get("loss").history() for t in (t0, t1)]
    assert own[0] == own[1]  # reduced: the same numbers on both ranks
    loss = dict(zip(*own[0]))
    assert lines[1]["loss"] == pytest.approx((loss[3] + loss[4]) / 2)  # the line of 4: the mean over its interval


def test_nan_on_one_rank_raises_on_both_at_the_same_iteration(trainer_factory: Any, tmp_path: Any) -> None:
    """Rank 0 sees the NaN at 6: the agreement point of 8 raises on both, naming iteration 6."""
    (t0, t1), _ = _two_trainers(trainer_factory, tmp_path, flush_secs=(3600.0, 0.0), nan_at=(6, None))
    e0, e1 = _run_ranks([t0.train, t1.train])
    assert isinstance(e0, FloatingPointError) and isinstance(e1, FloatingPointError), (e0, e1)
    assert t0.progress.iteration == t1.progress.iteration == 8
    assert "iteration 6 on rank 0: {'loss': nan}" in str(e0) and "iteration 6 on rank 0; " in str(e1)
    assert t0.strategy.gathered_at == t1.strategy.gathered_at == [4, 4, 5, 5, 5, 8, 8]  # type: ignore[attr-defined]  # none on the error path
    lines = [json.loads(line) for line in (t0.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["iter"] for line in lines] == [2, 4, 5, 7]  # the held lines reach the disk at the end of the run


def test_a_stop_proposed_on_one_rank_ends_both_after_the_same_iteration(trainer_factory: Any, tmp_path: Any) -> None:
    """Rank 1 proposes a stop before iteration 6 (a preemption signal): both stop after the point of 8, preempted,
    exit status 143."""
    (t0, t1), _ = _two_trainers(trainer_factory, tmp_path, flush_secs=(1.0, 1.0), stop_at=(None, 6))
    e0, e1 = _run_ranks([t0.train, t1.train])
    assert isinstance(e0, SystemExit) and isinstance(e1, SystemExit) and e0.code == e1.code == 143, (e0, e1)
    assert t0.progress.iteration == t1.progress.iteration == 8
    assert t0.preempted and t1.preempted
    assert t0.strategy.gathered_at == t1.strategy.gathered_at == [4, 4, 5, 5, 5, 8, 8, 8]  # type: ignore[attr-defined]


def test_one_process_makes_no_collective(trainer_factory: Any, tmp_path: Any) -> None:
    strategy = Rank(0, None, world=1)
    t = trainer_factory(
        model=LinearReg(),
        dataset=regression_set(40),
        batch_size=4,
        strategy=strategy,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        default_hooks=dict(logger=dict(interval=2, flush_secs=0)),
    )
    strategy.trainer = t
    t.train()
    assert strategy.gathered_at == []
    assert [
        r["iter"]
        for r in map(json.loads, (t.run_dir / "metrics.jsonl").read_text().splitlines())
        if r["mode"] == "train"
    ] == list(range(2, 21, 2))
