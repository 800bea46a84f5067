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
    assert (other.median(), other.mean(), other.global_avg, other.count) == (buf.median(), buf.mean(), buf.global_avg, buf.count)


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
        store.update_dict({"loss": torch.tensor(v), "loss_cls": torch.tensor(1.5), "acc": torch.tensor(float("nan"))}, i)
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


def test_store_state_round_trip_flushes_first():
    store = MetricStore()
    store.update_scalar("lr", 0.1, 1)
    store.update_dict({"loss": torch.tensor(2.0)}, 1)
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
            dataset=regression_set(2 * n), default_hooks=dict(checkpoint=None, logger=dict(interval=1000)),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01, momentum=0.9), clip_grad=dict(max_norm=1.0), accumulative_counts=2),
        )
        sync_calls.clear()
        t.train()
        counts.append(sum(sync_calls.values()))
    assert counts[0] >= 1  # the instrumentation sees the logging-interval flush
    assert counts[0] == counts[1], f"host syncs grow with iterations: {counts}"


def test_listeners_get_every_number_once_and_whether_the_flush_is_urgent() -> None:
    from trainwright.logging import MetricStore

    store = MetricStore(flush_every=3)
    calls: list[tuple[dict, bool]] = []
    store.add_listener(lambda cols, urgent: calls.append(({k: (list(i), list(v)) for k, (i, v) in cols.items()}, urgent)))
    for it in range(1, 5):
        store.update_dict({"loss": torch.tensor(float(it))}, it)  # the 3rd update flushes by itself
    store.flush()
    assert calls == [({"loss": ([1, 2, 3], [1.0, 2.0, 3.0])}, False), ({"loss": ([4], [4.0])}, True)]


def test_hot_path_rows_are_update_dict_without_the_call() -> None:
    """The train loop appends to hot_path()'s list: same numbers as update_dict, and the list survives flushes."""
    a, b = MetricStore(flush_every=3), MetricStore(flush_every=3)
    rows, limit = b.hot_path()
    assert limit == 3
    for it in range(1, 8):
        values = {"loss": torch.tensor(float(it)), "acc": torch.tensor(it / 10)}
        a.update_dict(values, it)
        rows.append((it, values))
        if len(rows) >= limit:
            b.flush(urgent=False)
        assert b.hot_path()[0] is rows
    a.flush()
    b.flush()
    assert a.state_dict() == b.state_dict()
    b.load_state_dict(a.state_dict())
    assert b.hot_path()[0] is rows and not rows
