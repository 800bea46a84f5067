"""Evaluator: building metrics, merging their reports, and the errors users hit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from sklearn.metrics import accuracy_score

from trainwright.evaluation import Accuracy, Evaluator, Metric
from trainwright.registry import METRICS


class MeanAbsError(Metric):
    """Per-sample layout: one Python float per sample."""

    def process(self, data_batch: Any, outputs: Any) -> None:
        self.results.extend(zip(outputs.argmax(1), data_batch[1]))

    def compute(self, results: list[Any]) -> dict[str, float]:
        return {"mae": sum(abs(float(p) - float(t)) for p, t in results) / len(results), "n": len(results)}


def data(n: int = 60, c: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(n, c, generator=g), torch.randint(0, c, (n,), generator=g)


def test_several_metrics_are_merged_into_one_dict() -> None:
    scores, y = data()
    evaluator = Evaluator([dict(type="Accuracy", topk=(1, 3)), MeanAbsError()])
    for start in range(0, 60, 25):
        s = slice(start, start + 25)
        evaluator.process((scores[s], y[s]), scores[s])
    result = evaluator.evaluate(60)
    pred = scores.argmax(1)
    assert set(result) == {"acc/top1", "acc/top3", "mae", "n"}
    assert result["acc/top1"] == pytest.approx(accuracy_score(y.numpy(), pred.numpy()))
    assert result["mae"] == pytest.approx((pred - y).abs().float().mean().item())
    assert result["n"] == 60


def test_single_metric_or_config_is_accepted() -> None:
    assert isinstance(Evaluator(Accuracy()).metrics[0], Accuracy)
    assert isinstance(Evaluator(dict(type="Accuracy")).metrics[0], Accuracy)


def test_duplicate_key_is_an_error_naming_the_key_and_the_fix() -> None:
    scores, y = data()
    evaluator = Evaluator([Accuracy(), dict(type="Accuracy")])
    evaluator.process((scores, y), scores)
    with pytest.raises(ValueError, match=r"'acc'.*prefix"):
        evaluator.evaluate(60)
    assert all(m.results == [] for m in evaluator.metrics)  # nothing left over for the next run


def test_prefix_resolves_a_duplicate() -> None:
    scores, y = data()
    evaluator = Evaluator([Accuracy(), dict(type="Accuracy", prefix="again")])
    evaluator.process((scores, y), scores)
    result = evaluator.evaluate(60)
    assert result["acc"] == result["again/acc"]


def test_unknown_metric_type_suggests_the_close_match() -> None:
    with pytest.raises(KeyError, match="Did you mean 'Accuracy'"):
        Evaluator(dict(type="Acuracy"))
    assert "Accuracy" in METRICS.names()


def test_non_metric_objects_and_empty_lists_are_rejected() -> None:
    with pytest.raises(TypeError, match="Metric"):
        Evaluator([torch.nn.Linear(1, 1)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="at least one metric"):
        Evaluator([])


def test_reset_and_state_dict() -> None:
    scores, y = data()
    evaluator = Evaluator([Accuracy(), MeanAbsError()])
    evaluator.process((scores[:30], y[:30]), scores[:30])
    restored = Evaluator([Accuracy(), MeanAbsError()])
    restored.load_state_dict(evaluator.state_dict())
    restored.process((scores[30:], y[30:]), scores[30:])
    assert restored.evaluate(60)["acc"] == pytest.approx(accuracy_score(y.numpy(), scores.argmax(1).numpy()))
    evaluator.reset()
    assert all(m.results == [] for m in evaluator.metrics)
    with pytest.raises(ValueError, match="same metrics"):
        Evaluator(Accuracy()).load_state_dict(restored.state_dict())


def test_compute_may_return_tensors_and_they_become_floats() -> None:
    class TensorMean(Metric):
        batched_results = True

        def process(self, data_batch: Any, outputs: Any) -> None:
            self.results.append(outputs)

        def compute(self, results: list[Any]) -> dict[str, float]:
            return {"mean": torch.cat(results).mean()}

    metric = TensorMean()
    values = torch.arange(10.0)
    metric.process(None, values[:4])
    metric.process(None, values[4:])
    result = metric.evaluate(10)
    assert result == {"mean": pytest.approx(4.5)} and isinstance(result["mean"], float)
