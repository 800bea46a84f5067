"""torchmetrics metrics as validation metrics: same numbers as trainwright's own, through Trainer.val()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed
import torch.multiprocessing as mp
import torch.nn.functional as F
from conftest import classification_set
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainwright as tw
from trainwright.evaluation import Accuracy, Evaluator, TorchMetric

torchmetrics = pytest.importorskip("torchmetrics")


class Clf(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        logits = self.linear(x)
        return {"loss": F.cross_entropy(logits, y)} if mode == "loss" else logits


def test_multiclass_accuracy_equals_trainwright_accuracy_through_val(trainer_factory: Any) -> None:
    ds = classification_set(30)
    evaluators = [
        Accuracy(),
        torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro"),
        dict(type="TorchMetric", metric="classification.MulticlassF1Score", metric_args=dict(num_classes=3), key="f1"),
    ]
    t = trainer_factory(model=Clf(), dataset=ds, val_dataloader=DataLoader(ds, batch_size=7), val_evaluator=evaluators)
    first = t.val()
    assert first["val/MulticlassAccuracy"] == pytest.approx(first["val/acc"], abs=1e-7)  # float32 inside torchmetrics
    model = t.unwrapped_model
    with torch.no_grad():
        preds = model(ds.tensors[0]).argmax(1)
    from sklearn.metrics import f1_score

    assert first["val/f1"] == pytest.approx(f1_score(ds.tensors[1].numpy(), preds.numpy(), average="macro"), abs=1e-6)
    t.train()
    second = t.val()  # state was reset after the first pass: the second is not a running total
    assert second["val/MulticlassAccuracy"] == pytest.approx(second["val/acc"], abs=1e-7)
    assert second["val/acc"] == pytest.approx(
        float((t.unwrapped_model(ds.tensors[0]).argmax(1) == ds.tensors[1]).float().mean()), abs=1e-7
    )


def test_collections_per_class_results_state_and_errors() -> None:
    preds = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    target = torch.tensor([0, 1, 1, 0])
    coll = torchmetrics.MetricCollection(
        {"acc": torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")}
    )
    per_class = torchmetrics.classification.MulticlassRecall(num_classes=3, average=None)
    ev = Evaluator([coll, TorchMetric(per_class, key="recall", prefix="pc")])
    ev.process((preds[:2], target[:2]), preds[:2])
    state = ev.state_dict()
    ev2 = Evaluator(
        [
            torchmetrics.MetricCollection(
                {"acc": torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")}
            ),
            TorchMetric(
                torchmetrics.classification.MulticlassRecall(num_classes=3, average=None), key="recall", prefix="pc"
            ),
        ]
    )
    ev2.load_state_dict(state)  # a checkpoint taken mid-validation goes on where it was
    ev2.process((preds[2:], target[2:]), preds[2:])
    out = ev2.evaluate(4)
    assert out["acc"] == pytest.approx(0.75)
    assert [out[f"pc/recall/{c}"] for c in range(3)] == pytest.approx([1.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="no results to evaluate"):
        ev2.evaluate(4)
    with pytest.raises(TypeError, match="torchmetrics.Metric"):
        TorchMetric(Accuracy())
    with pytest.raises(KeyError, match="no metric class 'MultiAcc'"):
        TorchMetric("MultiAcc")


# -- two processes: torchmetrics synchronises its own state ------------------------------------
WORLD = 2


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        g = torch.Generator().manual_seed(3)
        scores, target = torch.randn(24, 3, generator=g), torch.randint(0, 3, (24,), generator=g)
        ds = TensorDataset(scores, target)
        loader = DataLoader(
            ds, batch_size=5, sampler=DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=False)
        )
        ev = Evaluator([Accuracy(), torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")])
        for batch in loader:
            ev.process(batch, batch[0])
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(ev.evaluate(len(ds))))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_processes_compute_the_whole_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    g = torch.Generator().manual_seed(3)
    scores, target = torch.randn(24, 3, generator=g), torch.randint(0, 3, (24,), generator=g)
    whole = float((scores.argmax(1) == target).float().mean())
    for report in reports:  # 24 samples over 2 processes: no padding, both see the whole-dataset number
        assert report["acc"] == pytest.approx(whole)
        assert report["MulticlassAccuracy"] == pytest.approx(whole, abs=1e-7)
