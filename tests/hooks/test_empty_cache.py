"""EmptyCacheHook (mmengine's): ``torch.cuda.empty_cache()`` at the events its arguments name, and no call per
iteration unless asked."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import regression_set
from torch.utils.data import DataLoader

from trainwright.evaluation import Metric


class Count(Metric):
    def process(self, data_batch: Any, outputs: Any) -> None:
        self.results.append(1.0)

    def compute(self, results: list[Any]) -> dict[str, float]:
        return {"n": float(len(results))}


@pytest.mark.parametrize(
    ("args", "calls"),
    [
        (dict(), 2 + 2),  # after each of 2 training epochs and 2 validations
        (
            dict(before_epoch=True, after_iter=True),
            4 + 4 + 2 * 3,
        ),  # also before each, and after each of 3 iterations per epoch
    ],
)
def test_empty_cache_runs_at_the_events_asked_for(
    trainer_factory: Any, monkeypatch: pytest.MonkeyPatch, args: dict, calls: int
) -> None:
    emptied: list[int] = []
    # instrumentation of torch (a CUDA process is simulated): the hook under test runs unmodified
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    t = trainer_factory(
        dataset=regression_set(12),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        val_dataloader=DataLoader(regression_set(8), batch_size=4),
        val_evaluator=Count(),
        custom_hooks=[dict(type="EmptyCacheHook", **args)],
    )
    t.train()
    assert len(emptied) == calls
