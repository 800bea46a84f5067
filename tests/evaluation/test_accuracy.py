"""Accuracy against scikit-learn and hand computations, on the batch shapes users feed it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from sklearn.metrics import accuracy_score

from trainwright.evaluation import Accuracy, Evaluator


def batches(n: int, batch_size: int) -> Iterator[slice]:
    for start in range(0, n, batch_size):
        yield slice(start, min(start + batch_size, n))


def hand_topk(scores: torch.Tensor, target: torch.Tensor, k: int) -> float:
    """Top-k accuracy by sorting each row in Python (ties: lower class index first, like argmax)."""
    hits = 0
    for row, t in zip(scores.tolist(), target.tolist()):
        order = sorted(range(len(row)), key=lambda c: (-row[c], c))
        hits += t in order[:k]
    return hits / len(target)


def test_top1_equals_sklearn_accuracy_over_many_batches() -> None:
    g = torch.Generator().manual_seed(0)
    n, c = 203, 7
    scores = torch.randn(n, c, generator=g)
    target = torch.randint(0, c, (n,), generator=g)
    metric = Accuracy()
    for s in batches(n, 32):
        metric.process((scores[s], target[s]), scores[s])
    result = metric.evaluate(n)
    assert list(result) == ["acc"]
    assert result["acc"] == pytest.approx(accuracy_score(target.numpy(), scores.argmax(1).numpy()))
    assert 0.0 < result["acc"] < 1.0
    assert metric.results == []  # cleared for the next validation


def test_label_predictions_equal_sklearn() -> None:
    g = torch.Generator().manual_seed(1)
    pred = torch.randint(0, 4, (50,), generator=g)
    target = torch.randint(0, 4, (50,), generator=g)
    metric = Accuracy()
    metric.process([None, target], pred)
    assert metric.evaluate(50)["acc"] == pytest.approx(accuracy_score(target.numpy(), pred.numpy()))


def test_topk_equals_hand_computation() -> None:
    g = torch.Generator().manual_seed(2)
    n, c = 97, 10
    scores = torch.randn(n, c, generator=g)
    target = torch.randint(0, c, (n,), generator=g)
    metric = Accuracy(topk=(1, 3, 5))
    for s in batches(n, 16):
        metric.process({"x": None, "label": target[s]}, scores[s])
    result = metric.evaluate(n)
    assert list(result) == ["acc/top1", "acc/top3", "acc/top5"]
    for k in (1, 3, 5):
        assert result[f"acc/top{k}"] == pytest.approx(hand_topk(scores, target, k))


def test_ties_are_broken_like_argmax() -> None:
    # integer scores with many ties: top-1 must agree with argmax (first maximal index)
    g = torch.Generator().manual_seed(3)
    scores = torch.randint(0, 3, (200, 5), generator=g).float()
    target = torch.randint(0, 5, (200,), generator=g)
    metric = Accuracy(topk=(1, 2))
    metric.process((scores, target), scores)
    result = metric.evaluate(200)
    assert result["acc/top1"] == pytest.approx(accuracy_score(target.numpy(), scores.argmax(1).numpy()))
    assert result["acc/top2"] == pytest.approx(hand_topk(scores, target, 2))


@pytest.mark.parametrize(
    ("make_batch", "make_outputs", "kwargs"),
    [
        (lambda x, y: (x, y), lambda s, y: s, {}),
        (lambda x, y: [x, torch.zeros(len(y)), y], lambda s, y: s, {}),
        (lambda x, y: {"inputs": x, "labels": y}, lambda s, y: s, {}),
        (lambda x, y: {"inputs": x, "y": y}, lambda s, y: s, {}),
        (lambda x, y: {"inputs": x, "cls": y}, lambda s, y: s, {"target_key": "cls"}),
        (lambda x, y: {"inputs": x, "data_samples": y}, lambda s, y: s, {}),
        (lambda x, y: {"inputs": x}, lambda s, y: {"logits": s, "target": y}, {}),
        (
            lambda x, y: {"inputs": x, "label": torch.zeros_like(y)},
            lambda s, y: {"pred": s, "label": y},
            {},
        ),  # outputs win
        (lambda x, y: (x, y.unsqueeze(1)), lambda s, y: s, {}),
        (lambda x, y: (x, torch.nn.functional.one_hot(y, 6)), lambda s, y: s, {}),
        (lambda x, y: (x, y.tolist()), lambda s, y: s, {}),
    ],
    ids=[
        "tuple",
        "list-last",
        "dict-labels",
        "dict-y",
        "dict-target_key",
        "dict-mmengine-data_samples",
        "outputs-dict",
        "outputs-dict-over-batch",
        "target-N1",
        "one-hot",
        "python-list",
    ],
)
def test_target_is_found_in_every_supported_batch_layout(
    make_batch: Callable[..., Any], make_outputs: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, 3, generator=g)
    scores = torch.randn(40, 6, generator=g)
    y = torch.randint(0, 6, (40,), generator=g)
    metric = Accuracy(**kwargs)
    metric.process(make_batch(x, y), make_outputs(scores, y))
    assert metric.evaluate(40)["acc"] == pytest.approx(accuracy_score(y.numpy(), scores.argmax(1).numpy()))


def test_bad_inputs_name_the_problem_and_the_fix() -> None:
    scores, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    with pytest.raises(KeyError, match="target_key"):
        Accuracy().process({"inputs": scores, "cls": y}, scores)
    with pytest.raises(
        KeyError, match="a tensor in data_samples.*target_key"
    ):  # mmengine data-sample objects are not read
        Accuracy().process({"inputs": scores, "data_samples": [object()] * 4}, scores)
    with pytest.raises(ValueError, match="use topk=1"):
        Accuracy(topk=(1, 2)).process((scores, y), scores.argmax(1))
    with pytest.raises(ValueError, match="only 3 classes"):
        Accuracy(topk=5).process((scores, y), scores)
    with pytest.raises(ValueError, match="does not match"):
        Accuracy().process((scores, y[:3]), scores)
    with pytest.raises(ValueError, match="positive int"):
        Accuracy(topk=0)
    metric = Accuracy()
    metric.process((scores, torch.tensor([0, 1, 3, -1])), scores)
    with pytest.raises(ValueError, match="2 target label"):
        metric.evaluate(4)
    with pytest.raises(ValueError, match="no results"):
        Accuracy().evaluate(10)


def test_prefix_and_registry_build() -> None:
    scores, y = torch.eye(3), torch.tensor([0, 1, 0])
    metric = Evaluator(dict(type="Accuracy", prefix="cls")).metrics[0]
    assert isinstance(metric, Accuracy)
    metric.process((scores, y), scores)
    assert metric.evaluate(3) == {"cls/acc": pytest.approx(2 / 3)}


def test_state_dict_round_trip_keeps_partial_results() -> None:
    scores, y = torch.eye(4), torch.tensor([0, 1, 0, 3])
    first = Accuracy()
    first.process((scores[:2], y[:2]), scores[:2])
    second = Accuracy()
    second.load_state_dict(first.state_dict())
    second.process((scores[2:], y[2:]), scores[2:])
    assert second.evaluate(4)["acc"] == pytest.approx(0.75)


@pytest.mark.parametrize("topk", [1, (1, 5)])
def test_process_does_not_sync_with_the_host(
    sync_calls: Counter[str], monkeypatch: pytest.MonkeyPatch, topk: int | tuple[int, ...]
) -> None:
    scores, y = torch.randn(64, 10), torch.randint(0, 10, (64,))
    metric = Accuracy(topk=topk)
    torch.tensor(1.0).item()  # the instrumentation itself works ...
    assert sync_calls == Counter(item=1)
    sync_calls.clear()
    for s in batches(64, 16):
        metric.process((scores[s], y[s]), scores[s])
        metric.process({"label": y[s]}, {"logits": scores[s]})
    assert sync_calls == Counter()  # ... and process() made none of those calls
    assert all(isinstance(r, torch.Tensor) for r in metric.results)
    monkeypatch.undo()
    assert metric.evaluate(128)  # the sync happens here, once


@pytest.mark.cuda
def test_process_on_cuda_makes_no_stream_synchronisation() -> None:
    scores, y = torch.randn(64, 10, device="cuda"), torch.randint(0, 10, (64,))
    metric = Accuracy(topk=(1, 5))
    metric.process((scores, y), scores)  # warm-up (lazy CUDA initialisation may sync)
    metric.reset()
    torch.cuda.set_sync_debug_mode("error")
    try:
        metric.process((scores, y.cuda(non_blocking=True)), scores)
        metric.process({"label": y}, {"logits": scores})
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = accuracy_score(y.numpy(), scores.argmax(1).cpu().numpy())
    assert metric.evaluate(128)["acc/top1"] == pytest.approx(expected)
