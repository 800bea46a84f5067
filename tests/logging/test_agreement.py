"""Flushes, the non-finite-loss decision and the logged numbers agree on every process.

Two "processes" are two threads; their collective is started as ``Strategy.all_gather_async``
starts it (nothing waits) and its ``wait`` is a barrier that stacks both tensors of that
collective. A rank that waited for a collective the other did not make would break the
barrier (a hang under real processes) and fail the test.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import trainwright as tw
from conftest import LinearReg, regression_set
from trainwright.logging import MetricStore
from trainwright.strategies.single_device import SingleDeviceStrategy


class FakeGather:
    """``all_gather_async`` for ``n`` threads: ``start(t)`` keeps ``t``; its ``wait()`` meets every thread's wait of the same call and stacks their tensors."""

    def __init__(self, n: int = 2) -> None:
        self.barrier = threading.Barrier(n, timeout=20)
        self.sent: list[list[torch.Tensor]] = [[] for _ in range(n)]
        self.calls = [0] * n

    def for_rank(self, rank: int) -> Callable[[torch.Tensor], Callable[[], torch.Tensor]]:
        def start(t: torch.Tensor) -> Callable[[], torch.Tensor]:
            i = len(self.sent[rank])
            self.sent[rank].append(t.clone())
            self.calls[rank] += 1

            def wait() -> torch.Tensor:
                self.barrier.wait()  # every thread has started call i and waits for it now
                return torch.stack([sent[i] for sent in self.sent])

            return wait

        return start


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


def test_store_flushes_and_raises_at_the_same_iteration_on_both_ranks() -> None:
    """Different clocks propose different flushes, a NaN is seen by one rank only: both act together, one logging iteration later."""
    gather = FakeGather()
    # Each rank's own clock says "due" at different logging iterations (5: rank 0 only, 10: rank 1 only).
    due = {0: {5: True, 10: False, 15: False}, 1: {5: False, 10: True, 15: False}}

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            store = MetricStore(gather=gather.for_rank(r))
            flushed, applied = [], {}
            for it in range(1, 16):
                loss = float("nan") if (r == 0 and it == 7) else float(it)
                store.record(it, {"loss": torch.tensor(loss)}, None, None)
                if it % 5 == 0:
                    try:
                        if store.flush_if(due[r][it], iteration=it):
                            flushed.append(it)
                    except FloatingPointError as e:
                        return flushed, applied, it, str(e)
                    applied[it] = store.get("loss").latest_iter if "loss" in store else None
            return flushed, applied, None, ""

        return run

    (flushed0, applied0, raised0, msg0), (flushed1, applied1, raised1, msg1) = _run_ranks([rank(0), rank(1)])
    # The answer of logging iteration k is applied at the next one, k + 5: at 5 nothing is in the
    # buffers yet, at 10 the (reduced) numbers up to 5 and rank 0's "write" proposal of 5.
    assert applied0 == applied1 == {5: None, 10: 5}
    assert flushed0 == flushed1 == [10]
    # The NaN of iteration 7 travels in the collective of 10 and raises on both ranks at 15.
    assert raised0 == raised1 == 15
    assert "at iteration 7: {'loss': nan}" in msg0
    assert "another process in iterations 6..10" in msg1 and "nonfinite_loss='skip'" in msg1
    assert gather.calls == [2, 2]  # one collective per flush_if (5, 10), none per record; at 15 the answer raises before 15's starts


def test_flushed_numbers_are_reduced_over_the_processes() -> None:
    """detectron2 semantics: every rank's buffers hold the mean loss and the slowest rank's data_time, per iteration."""
    gather = FakeGather()

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            store = MetricStore(gather=gather.for_rank(r))
            store.start_clock(0.0)
            end = 0.0
            for it in range(1, 5):
                wait = 0.1 * it if r == 0 else 0.05  # rank 0's loader is slower from iteration 2 on
                store.record(it, {"loss": torch.tensor(float(it + 10 * r)), "acc": torch.tensor(float(r))}, end + wait, end + wait + 1.0)
                end += wait + 1.0
            store.flush()
            return {name: store.get(name).history() for name in ("loss", "acc", "data_time", "time")}

        return run

    out0, out1 = _run_ranks([rank(0), rank(1)])
    assert out0 == out1  # the same numbers on every rank
    assert out0["loss"] == ([1, 2, 3, 4], [6.0, 7.0, 8.0, 9.0])  # mean of it and it + 10
    assert out0["acc"][1] == [0.5] * 4
    assert out0["data_time"][1] == pytest.approx([0.1, 0.2, 0.3, 0.4])  # max over ranks
    assert out0["time"][1] == pytest.approx([(1.1 + 1.05) / 2, (1.2 + 1.05) / 2, (1.3 + 1.05) / 2, (1.4 + 1.05) / 2])  # mean
    assert gather.calls == [1, 1]


def test_processes_logging_different_names_get_a_clear_error() -> None:
    gather = FakeGather()

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            store = MetricStore(gather=gather.for_rank(r))
            if r == 0:  # two values on each rank, under other names
                store.record(1, {"loss": torch.tensor(1.0)}, None, None)
                store.record(2, {"loss": torch.tensor(1.0)}, None, None)
            else:
                store.record(1, {"loss": torch.tensor(1.0), "extra": torch.tensor(2.0)}, None, None)
            store.flush()

        return run

    e0, e1 = _run_ranks([rank(0), rank(1)])
    assert isinstance(e0, RuntimeError) and isinstance(e1, RuntimeError)
    assert "log the same names" in str(e0) and "extra" in str(e1)


class Rank(SingleDeviceStrategy):
    """A one-process strategy playing rank ``r`` of two, its collectives through a :class:`FakeGather`."""

    def __init__(self, r: int, gather: Callable[[torch.Tensor], Callable[[], torch.Tensor]]) -> None:
        super().__init__(device="cpu")
        self._r = r
        self._gather = gather
        self.trainer: Any = None
        self.gathered_at: list[int] = []  # the iterations collectives were started at
        self.waited_at: list[int] = []  # the iterations their answers were waited for at, in the same order

    @property
    def rank(self) -> int:
        return self._r

    @property
    def world_size(self) -> int:
        return 2

    def all_gather_async(self, tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        self.gathered_at.append(self.trainer.progress.iteration)
        wait = self._gather(tensor)

        def waited() -> torch.Tensor:
            self.waited_at.append(self.trainer.progress.iteration)
            return wait()

        return waited


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


def _two_trainers(trainer_factory: Any, tmp_path: Any, flush_secs: tuple[float, float], nan_at: tuple[int | None, int | None], agree_secs: float) -> list[tw.Trainer]:
    gather = FakeGather()
    trainers = []
    for r in (0, 1):
        strategy = Rank(r, gather.for_rank(r))
        t = trainer_factory(
            model=NaNAt(nan_at[r]), work_dir=tmp_path / f"rank{r}", dataset=regression_set(40), batch_size=4, strategy=strategy,
            train_cfg=dict(by_epoch=True, max_epochs=2), default_hooks=dict(checkpoint=None, logger=dict(interval=2, flush_secs=flush_secs[r])), log_level="INFO",
        )
        strategy.trainer = t
        t.metric_store.agree_secs = agree_secs
        trainers.append(t)
    return trainers


def test_trainers_with_different_clocks_agree_once_per_logging_iteration(trainer_factory: Any, tmp_path: Any) -> None:
    """Rank 0's clock always says "write now" (flush_secs=0), rank 1's never (an hour): one collective per logging iteration, none elsewhere."""
    # agree_secs=0: every logging iteration is an agreement point (the exact iterations of the pipelined agreement).
    t0, t1 = _two_trainers(trainer_factory, tmp_path, flush_secs=(0.0, 3600.0), nan_at=(None, None), agree_secs=0.0)
    assert _run_ranks([t0.train, t1.train]) == [t0.unwrapped_model, t1.unwrapped_model]
    # 40 samples sharded over 2 ranks: 5 iterations per epoch; lines at 2, 4, the epoch's last (5), 6, 8, 10.
    # The preemption check (every 10) and the epoch-end flushes ride on the logger's collective.
    assert t0.strategy.gathered_at == t1.strategy.gathered_at == [2, 4, 5, 6, 8, 10]  # type: ignore[attr-defined]
    # Each answer is waited for at the next logging iteration, or at the epoch end (5, 10) that follows it.
    assert t0.strategy.waited_at == t1.strategy.waited_at == [4, 5, 5, 8, 10, 10]  # type: ignore[attr-defined]
    t0.flush_logs()
    assert (t0.run_dir / "metrics.jsonl").exists() and not (t1.run_dir / "metrics.jsonl").exists()
    lines = [json.loads(line) for line in (t0.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["iter"] for line in lines] == [2, 4, 5, 6, 8, 10]
    # rank 0 logs the mean loss of both ranks: the mean of the two ranks' own (local) loss buffers
    own = [t.metric_store.get("loss").history()[1] for t in (t0, t1)]
    assert own[0] == own[1]  # reduced, so the same on both


def test_nan_on_one_rank_raises_on_both_at_the_same_iteration(trainer_factory: Any, tmp_path: Any) -> None:
    """Rank 0 sees the NaN (iteration 6) but its clock would wait an hour: the answer of logging iteration 6, applied at 8, raises on both."""
    # agree_secs=0: every logging iteration is an agreement point (the exact iterations of the pipelined agreement).
    t0, t1 = _two_trainers(trainer_factory, tmp_path, flush_secs=(3600.0, 0.0), nan_at=(6, None), agree_secs=0.0)
    e0, e1 = _run_ranks([t0.train, t1.train])
    assert isinstance(e0, FloatingPointError) and isinstance(e1, FloatingPointError), (e0, e1)
    assert t0.progress.iteration == t1.progress.iteration == 8  # one logging interval after the NaN
    assert "iteration 6: {'loss': nan}" in str(e0) and "another process" in str(e1)
    assert t0.strategy.gathered_at == t1.strategy.gathered_at == [2, 4, 5, 6]  # type: ignore[attr-defined]  # none started at 8
    t0.flush_logs()
    lines = (t0.run_dir / "metrics.jsonl").read_text().splitlines()
    # The lines up to the NaN (5: the end of a 5-iteration epoch of this rank's shard), as a blocking agreement gives.
    assert [line.split('"iter": ')[1].split(",")[0] for line in lines] == ["2", "4", "5", "6"]


def test_trainers_agree_at_the_cadence_and_raise_a_nan_at_the_next_settling_flush(trainer_factory: Any, tmp_path: Any) -> None:
    """agree_secs=3600: after the first two agreements (no pace known before), no logging iteration agrees; the epoch ends settle everything."""
    t0, t1 = _two_trainers(trainer_factory, tmp_path, flush_secs=(0.0, 3600.0), nan_at=(6, None), agree_secs=3600.0)
    e0, e1 = _run_ranks([t0.train, t1.train])
    assert isinstance(e0, FloatingPointError) and isinstance(e1, FloatingPointError), (e0, e1)
    # 2: every call agrees (no pace yet); 4: the answer of 2 sets the gap (an hour's worth, capped at
    # flush_every = 1000), so 5, 6, 8 and 10 start nothing; the epoch ends (5, 10) are blocking flushes.
    assert t0.strategy.gathered_at == t1.strategy.gathered_at == [2, 4, 5, 10]  # type: ignore[attr-defined]
    assert t0.strategy.waited_at == t1.strategy.waited_at == [4, 5, 5, 10]  # type: ignore[attr-defined]
    assert t0.progress.iteration == t1.progress.iteration == 10  # the NaN of 6 raises at the epoch end, on both
    assert "iteration 6: {'loss': nan}" in str(e0) and "another process" in str(e1)
    t0.flush_logs()
    lines = [json.loads(line) for line in (t0.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["iter"] for line in lines] == [2, 4, 5, 6, 8, 10]  # every line, written at the settling flushes


def _timed_ranks(gather: FakeGather, paces: tuple[float, float], agree_secs: tuple[float, float], flush_every: int, iters: int,
                 due_at: int | None = None, nan_at: int | None = None) -> list[Any]:
    """Two stores recording one row per iteration, ``paces[r]`` seconds apart; ``flush_if`` every 5 iterations.

    Returns per rank: the iterations that made a collective (``flush_if``'s, or the store's own flush in ``record``), those where ``flush_if`` returned True,
    and the iteration a FloatingPointError was raised at (None: none).
    """

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            store = MetricStore(gather=gather.for_rank(r), agree_secs=agree_secs[r], flush_every=flush_every)
            store.start_clock(0.0)
            started, written = [], []
            for it in range(1, iters + 1):
                loss = float("nan") if (r == 1 and it == nan_at) else 1.0
                try:
                    before = gather.calls[r]
                    store.record(it, {"loss": torch.tensor(loss)}, paces[r] * (it - 1), paces[r] * it)  # flushes every flush_every rows
                    if it % 5 == 0 and store.flush_if(r == 0 and it == due_at, iteration=it):
                        written.append(it)
                    if gather.calls[r] > before:
                        started.append(it)
                except FloatingPointError:
                    return started, written, it
            return started, written, None

        return run

    return _run_ranks([rank(0), rank(1)])


def test_agreement_points_are_spaced_by_the_slowest_rank_s_pace() -> None:
    """Paces of 1/64 s and 1/32 s, agree_secs=1.25: the gap is 40 iterations (the minimum of 80 and 40) on both ranks."""
    (s0, w0, _), (s1, w1, _) = _timed_ranks(FakeGather(), paces=(2**-6, 2**-5), agree_secs=(1.25, 1.25), flush_every=1000, iters=200, due_at=15)
    # 5: no pace yet; 10 applies the answer of 5 (gap 40), so the next point is 50, then 90, 130, 170.
    assert s0 == s1 == [5, 10, 50, 90, 130, 170]
    # rank 0's "write" of 15 (between points) is held, carried at 50 and answered at 90 on both ranks.
    assert w0 == w1 == [90]


def test_a_nan_between_agreement_points_raises_on_both_ranks_one_point_later() -> None:
    (s0, _, raised0), (s1, _, raised1) = _timed_ranks(FakeGather(), paces=(2**-6, 2**-6), agree_secs=(1.25, 1.25), flush_every=1000, iters=200, nan_at=12)
    assert s0 == s1 == [5, 10, 90]  # gap 80: the NaN of 12 travels at 90 ...
    assert raised0 == raised1 == 170  # ... and raises on both at the next point, 170, before its collective starts


def test_the_gap_is_capped_by_flush_every() -> None:
    """agree_secs of an hour: the gap is flush_every (30) on both ranks, and the store's own flush of 30 rows settles a NaN there."""
    (s0, _, raised0), (s1, _, raised1) = _timed_ranks(FakeGather(), paces=(2**-6, 2**-6), agree_secs=(3600.0, 3600.0), flush_every=30, iters=100, nan_at=32)
    assert s0 == s1 == [5, 10]  # next point: 10 + 30
    assert raised0 == raised1 == 40  # at 40 the store flushes rows 11..40 (in record, blocking) and raises before the point
    (s0, _, _), (s1, _, _) = _timed_ranks(FakeGather(), paces=(2**-6, 2**-6), agree_secs=(3600.0, 3600.0), flush_every=30, iters=100)
    # without a NaN: one collective every 30 iterations, the store's own flush, which agrees on everything a point does
    # (so the next point counts from it and always falls on the next flush, where the flush comes first and takes the rows)
    assert s0 == s1 == [5, 10, 40, 70, 100]


def test_agree_secs_0_on_any_rank_agrees_at_every_call() -> None:
    """agree_secs=0 proposes no gap; the smallest proposal wins, so one rank's 0 makes every call an agreement point on both."""
    for secs in ((0.0, 0.0), (1.0, 0.0)):
        (s0, _, _), (s1, _, _) = _timed_ranks(FakeGather(), paces=(0.01, 0.01), agree_secs=secs, flush_every=1000, iters=40)
        assert s0 == s1 == [5, 10, 15, 20, 25, 30, 35, 40], secs


def test_agree_secs_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="agree_secs must be >= 0"):
        MetricStore(agree_secs=-1.0)
