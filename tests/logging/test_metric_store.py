"""MetricStore: windowed statistics, no host sync on the hot path, lazy flush, NaN detection."""

from __future__ import annotations

import random
import statistics

import pytest
import torch

from trainwright.logging import HistoryBuffer, MetricStore


def test_history_buffer_statistics_match_statistics_module():
    rng = random.Random(0)
    values = [rng.uniform(-5, 5) for _ in range(53)]
    buf = HistoryBuffer(window_size=7)
    for i, v in enumerate(values):
        buf.update(v, i)
    assert buf.median() == statistics.median(values[-7:])
    assert buf.mean() == pytest.approx(statistics.mean(values[-7:]), abs=1e-12)
    assert buf.median(3) == statistics.median(values[-3:])
    assert buf.mean(4) == pytest.approx(statistics.mean(values[-4:]), abs=1e-12)
    assert buf.global_avg == pytest.approx(statistics.mean(values), abs=1e-12)
    assert buf.latest == values[-1] and buf.latest_iter == 52 and buf.count == 53


def test_history_buffer_state_round_trip():
    buf = HistoryBuffer(window_size=3)
    for v in (1.0, 2.0, 3.0, 4.0):
        buf.update(v)
    other = HistoryBuffer()
    other.load_state_dict(buf.state_dict())
    assert (other.median(), other.mean(), other.global_avg, other.count) == (
        buf.median(),
        buf.mean(),
        buf.global_avg,
        buf.count,
    )


def test_update_dict_does_not_sync_and_flush_converts(sync_calls):
    store = MetricStore(window_size=20, flush_every=1000)
    expected = []
    for i in range(1, 51):
        loss = torch.tensor(float(i)) * 0.5
        store.update_dict({"loss": loss, "loss_aux": loss * 2, "acc": torch.full((3,), float(i))}, i)
        expected.append(i * 0.5)
    assert sum(sync_calls.values()) == 0, f"update_dict synced: {dict(sync_calls)}"
    assert "loss" not in store  # nothing converted yet
    store.flush()
    assert sum(sync_calls.values()) >= 1  # one batched transfer happened
    assert store.get("loss").count == 50
    assert store.get("loss").median() == statistics.median(expected[-20:])
    assert store.get("loss_aux").global_avg == pytest.approx(2 * statistics.mean(expected))
    assert store.get("acc").latest == 50.0  # non-scalar tensors are averaged
    assert store.get("loss").latest_iter == 50


def test_flush_every_bounds_pending():
    store = MetricStore(flush_every=5)
    for i in range(1, 12):
        store.update_dict({"loss": torch.tensor(float(i))}, i)
    assert store.get("loss").count == 10  # flushed at 5 and 10; 11 still pending
    assert store.latest()["loss"] == 11.0


def test_nonfinite_loss_names_iteration_and_losses():
    store = MetricStore(flush_every=1000)
    for i in range(1, 10):
        v = float("nan") if i == 7 else float(i)
        store.update_dict(
            {"loss": torch.tensor(v), "loss_cls": torch.tensor(1.5), "acc": torch.tensor(float("nan"))}, i
        )
    with pytest.raises(FloatingPointError, match=r"iteration 7: \{'loss': nan, 'loss_cls': 1.5, 'acc': nan\}") as err:
        store.flush()
    assert "nonfinite_loss='skip'" in str(err.value)


def test_nonfinite_non_loss_value_does_not_raise():
    store = MetricStore()
    store.update_dict({"loss": torch.tensor(1.0), "grad_norm": torch.tensor(float("inf"))}, 1)
    store.flush()
    assert store.get("grad_norm").latest == float("inf")


def test_raise_on_nonfinite_off_records_nan():
    store = MetricStore(raise_on_nonfinite=False)
    store.update_dict({"loss": torch.tensor(float("inf"))}, 1)
    store.flush()
    assert store.get("loss").latest == float("inf")


def test_store_state_round_trip():
    store = MetricStore()
    store.update_scalar("lr", 0.1, 1)
    store.update_dict({"loss": torch.tensor(2.0)}, 1)
    store.flush()  # the checkpoint manager flushes (through the trainer) before it collects
    state = store.state_dict()
    other = MetricStore()
    other.load_state_dict(state)
    assert other.latest() == {"lr": 0.1, "loss": 2.0}


def test_training_hot_path_syncs_do_not_grow_with_iterations(trainer_factory, sync_calls):
    """Between log intervals an iteration does no host sync: total sync calls are independent of the iteration count."""
    from conftest import regression_set

    counts = []
    for n in (10, 40):
        t = trainer_factory(
            dataset=regression_set(2 * n),
            default_hooks=dict(checkpoint=None, logger=dict(interval=1000)),
            optim_wrapper=dict(
                optimizer=dict(type="SGD", lr=0.01, momentum=0.9), clip_grad=dict(max_norm=1.0), accumulative_counts=2
            ),
        )
        sync_calls.clear()
        t.train()
        counts.append(sum(sync_calls.values()))
    assert counts[0] >= 1  # the instrumentation sees the logging-interval flush
    assert counts[0] == counts[1], f"host syncs grow with iterations: {counts}"


def test_automatic_flush_converts_every_number_once_with_its_iteration() -> None:
    """Every ``flush_every`` records the store converts by itself; each number arrives once, beside its iteration."""
    store = MetricStore(flush_every=3)
    seen = []
    for it in range(1, 5):
        store.update_dict({"loss": torch.tensor(float(it))}, it)  # the 3rd update flushes by itself
        seen.append(store.get("loss").history() if "loss" in store else None)
    assert seen[:2] == [None, None]
    assert seen[2] == seen[3] == ([1, 2, 3], [1.0, 2.0, 3.0])
    store.flush()
    assert store.get("loss").history() == ([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])


def test_record_is_update_dict_plus_timestamps() -> None:
    """``record`` (the train loop's one call per step) gives the same numbers as update_dict, and times once the
    clock runs."""
    a, b = MetricStore(flush_every=3), MetricStore(flush_every=3)
    b.start_clock(10.0)
    for it in range(1, 8):
        values = {"loss": torch.tensor(float(it)), "acc": torch.tensor(it / 10)}
        a.update_dict(values, it)
        b.record(it, values, 10.0 + it - 0.75, 10.0 + it)  # 0.25 s waiting for data, 1 s per iteration
    a.flush()
    b.flush()
    sa, sb = a.state_dict(), b.state_dict()
    assert {k: sb[k] for k in sa} == sa
    assert b.get("time").history() == (list(range(1, 8)), [pytest.approx(1.0)] * 7)
    assert b.get("data_time").history() == (list(range(1, 8)), [pytest.approx(0.25)] * 7)
    assert "time" not in a  # no timestamps, no times
    b.load_state_dict(a.state_dict())
    b.flush()
    assert b.state_dict() == sa  # nothing pending survives a load


def test_clock_restarts_between_iterations_exclude_the_gap() -> None:
    """A restart (epoch start, after validation) measures the next iteration from it, not from the previous one."""
    store = MetricStore()
    store.record(1, {"loss": 1.0}, 0.5, 1.0)  # before the clock starts: no times
    store.start_clock(1.0)
    store.record(2, {"loss": 1.0}, 1.5, 2.0)
    store.record(3, {"loss": 1.0}, 2.25, 3.0)
    store.start_clock(10.0)  # e.g. validation ran from 3.0 to 10.0
    store.flush()
    store.record(4, {"loss": 1.0}, 10.5, 11.0)
    store.flush()
    assert store.get("data_time").history() == ([2, 3, 4], [0.5, 0.25, 0.5])
    assert store.get("time").history() == ([2, 3, 4], [1.0, 1.0, 1.0])


def test_keep_history_keeps_values_beyond_the_statistics_window() -> None:
    store = MetricStore(window_size=4)
    store.keep_history(10)
    for it in range(1, 13):
        store.update_dict({"loss": float(it)}, it)
    store.flush()
    buf = store.get("loss")
    assert buf.history() == (list(range(3, 13)), [float(i) for i in range(3, 13)])
    assert buf.median() == statistics.median([9.0, 10.0, 11.0, 12.0])  # statistics still over window_size
    other = MetricStore(window_size=4)
    other.load_state_dict(store.state_dict())
    assert other.get("loss").history() == buf.history()  # a resumed run has the same history


def _times_by_hand(rows: list, starts: dict, prev_end: float | None, untimed_to: int) -> tuple:
    """The definition of data_time / time, one row at a time (the reference for derive_times)."""
    prev, iters, data, total = prev_end, [], [], []
    for k, (it, _, t0, t1) in enumerate(rows):
        if k in starts:
            prev = starts[k]
        if prev is None or t0 is None or t1 is None:
            continue
        if it > untimed_to:
            iters.append(it)
            data.append(t0 - prev)
            total.append(t1 - prev)
        prev = t1
    return iters, data, total, starts.get(len(rows), prev)


@pytest.mark.parametrize("seed", range(40))
def test_derive_times_equals_the_row_by_row_definition(seed: int) -> None:
    """Flushes of every shape (clock restarts inside, untimed rows, a warm-up, no clock yet) give each row's times as
    defined, bit for bit.

    The guard for any faster ``derive_times`` (a whole-column path for the usual flush was tried: docs/benchmarks.md,
    seventh pass).
    """
    from trainwright.logging.flush_batch import derive_times

    rng = random.Random(seed)
    n = rng.randint(1, 30)
    t, rows = 100.0, []
    for it in range(1, n + 1):
        untimed = rng.random() < (0.3 if seed % 4 == 1 else 0.0)
        t0, t1 = t + rng.random(), t + 1 + rng.random()
        rows.append((it, {"loss": 1.0}, None if untimed else t0, None if untimed else t1))
        t += 2
    starts = {}
    if seed % 4 == 2:
        starts = {k: 50.0 + k for k in rng.sample(range(n + 1), rng.randint(1, 3))}
    elif seed % 2 == 0:
        starts = {k: 60.0 for k in rng.sample([0, n], rng.randint(0, 2))}
    prev_end = None if seed % 8 == 3 else 99.5
    untimed_to = rng.choice([0, 0, n // 2])
    assert derive_times(rows, starts, prev_end, untimed_to) == _times_by_hand(rows, starts, prev_end, untimed_to)
