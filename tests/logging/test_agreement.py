"""Flushes and the non-finite-loss decision happen at the same iteration on every process.

Two "processes" are two threads; their agreement function is a barrier that ORs both flags,
as ``Strategy.any_true`` (an all-reduce) does. A rank that asked for an agreement the other
did not ask for would break the barrier (a hang under real processes) and fail the test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

import trainwright as tw
from conftest import LinearReg, regression_set
from trainwright.logging import MetricStore
from trainwright.strategies.single_device import SingleDeviceStrategy


class FakeAnyTrue:
    """``any_true`` for ``n`` threads: each call waits for every thread's flag and returns their OR."""

    def __init__(self, n: int = 2) -> None:
        self.barrier = threading.Barrier(n, timeout=20)
        self.flags = [False] * n

    def for_rank(self, rank: int) -> Callable[[bool], bool]:
        def agree(flag: bool) -> bool:
            self.flags[rank] = flag
            self.barrier.wait()
            out = any(self.flags)
            self.barrier.wait()  # nobody overwrites a flag before everyone has read them
            return out

        return agree


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
    """Different clocks propose different flushes, a NaN is seen by one rank only: both act together."""
    agree = FakeAnyTrue()
    # Each rank's own clock says "due" at different logging iterations (5: rank 0 only, 10: rank 1 only).
    due = {0: {5: True, 10: False, 15: False}, 1: {5: False, 10: True, 15: False}}

    def rank(r: int) -> Callable[[], Any]:
        def run() -> Any:
            store = MetricStore(agree=agree.for_rank(r))
            flushed = []
            for it in range(1, 16):
                loss = float("nan") if (r == 0 and it == 7) else float(it)
                store.record(it, {"loss": torch.tensor(loss)}, None, None)
                if it % 5 == 0:
                    try:
                        if store.flush_if(due[r][it]):
                            flushed.append(it)
                    except FloatingPointError as e:
                        return flushed, it, str(e)
            return flushed, None, ""

        return run

    (flushed0, raised0, msg0), (flushed1, raised1, msg1) = _run_ranks([rank(0), rank(1)])
    assert flushed0 == flushed1 == [5]  # the flush at 10 raised on both
    assert raised0 == raised1 == 10
    assert "at iteration 7: {'loss': nan}" in msg0
    assert "another process in iterations 6..10" in msg1 and "nonfinite_loss='skip'" in msg1


class Rank(SingleDeviceStrategy):
    """A one-process strategy playing rank ``r`` of two, agreeing through a :class:`FakeAnyTrue`."""

    def __init__(self, r: int, agree: Callable[[bool], bool]) -> None:
        super().__init__(device="cpu")
        self._r = r
        self._agree = agree

    @property
    def rank(self) -> int:
        return self._r

    @property
    def world_size(self) -> int:
        return 2

    def any_true(self, flag: bool) -> bool:
        return self._agree(flag)


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


def _two_trainers(trainer_factory: Any, tmp_path: Any, flush_secs: tuple[float, float], nan_at: tuple[int | None, int | None]) -> list[tw.Trainer]:
    agree = FakeAnyTrue()
    trainers = []
    for r in (0, 1):
        t = trainer_factory(
            model=NaNAt(nan_at[r]), work_dir=tmp_path / f"rank{r}", dataset=regression_set(40), batch_size=4, strategy=Rank(r, agree.for_rank(r)),
            train_cfg=dict(by_epoch=True, max_epochs=2), default_hooks=dict(checkpoint=None, logger=dict(interval=2, flush_secs=flush_secs[r])), log_level="INFO",
        )
        flushes: list[int] = []

        def spy(*args: Any, _flush: Any = t.metric_store.flush, _log: list[int] = flushes, _p: Any = t.progress, **kwargs: Any) -> None:
            _log.append(_p.iteration)  # the iteration of every flush (a sync point)
            _flush(*args, **kwargs)

        t.metric_store.flush = spy  # type: ignore[method-assign]
        t.flush_log = flushes  # type: ignore[attr-defined]
        trainers.append(t)
    return trainers


def test_trainers_with_different_clocks_flush_at_the_same_iterations(trainer_factory: Any, tmp_path: Any) -> None:
    """Rank 0's clock always says "write now" (flush_secs=0), rank 1's never (an hour): both flush at every line."""
    t0, t1 = _two_trainers(trainer_factory, tmp_path, flush_secs=(0.0, 3600.0), nan_at=(None, None))
    assert _run_ranks([t0.train, t1.train]) == [t0.unwrapped_model, t1.unwrapped_model]
    assert t0.flush_log == t1.flush_log  # type: ignore[attr-defined]
    assert set(range(2, 11, 2)) <= set(t0.flush_log)  # type: ignore[attr-defined]  # 40 samples sharded over 2 ranks: 5 iterations per epoch
    t0.flush_logs()
    assert (t0.run_dir / "metrics.jsonl").exists() and not (t1.run_dir / "metrics.jsonl").exists()


def test_nan_on_one_rank_raises_on_both_at_the_same_iteration(trainer_factory: Any, tmp_path: Any) -> None:
    """Rank 0 sees the NaN (iteration 6) but its clock would wait an hour; rank 1 proposes the flush: both raise at 6."""
    t0, t1 = _two_trainers(trainer_factory, tmp_path, flush_secs=(3600.0, 0.0), nan_at=(6, None))
    e0, e1 = _run_ranks([t0.train, t1.train])
    assert isinstance(e0, FloatingPointError) and isinstance(e1, FloatingPointError), (e0, e1)
    assert t0.progress.iteration == t1.progress.iteration == 6
    assert "iteration 6: {'loss': nan}" in str(e0) and "another process" in str(e1)
    t0.flush_logs()
    lines = (t0.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [line.split('"iter": ')[1].split(",")[0] for line in lines] == ["2", "4", "5", "6"]  # the lines up to the NaN (5: the end of a 5-iteration epoch of this rank's shard)
