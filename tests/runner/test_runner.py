"""A script written against mmengine's Runner API, with only its imports changed, trains and validates as a
hand-written loop."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import SGD
from torch.utils.data import Dataset, default_collate

# the script's imports: mmengine.evaluator / mmengine.model / mmengine.runner with the package renamed
from trainwright.evaluator import BaseMetric
from trainwright.model import BaseModel
from trainwright.runner import Runner


class MLP(BaseModel):
    """mmengine's examples/distributed_training.py model, an MLP instead of a ResNet."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, imgs: torch.Tensor, labels: torch.Tensor, mode: str) -> Any:
        x = self.net(imgs)
        if mode == "loss":
            return {"loss": F.cross_entropy(x, labels)}
        if mode == "predict":
            return x, labels
        return x


class Accuracy(BaseMetric):
    """The example's metric: one entry per batch, reduced by compute_metrics."""

    def process(self, data_batch: Any, data_samples: Any) -> None:
        score, gt = data_samples
        self.results.append({"batch_size": len(gt), "correct": (score.argmax(dim=1) == gt).sum().cpu()})

    def compute_metrics(self, results: list[Any]) -> dict[str, Any]:
        total_correct = sum(item["correct"] for item in results)
        total_size = sum(item["batch_size"] for item in results)
        return dict(accuracy=100 * total_correct / total_size)


class Blobs(Dataset):
    """Random inputs and labels; records the indices the sampler hands it."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)
        self.seen: list[Any] = []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen.append(i)
        return self.x[i], self.y[i]


def test_an_mmengine_runner_script_trains_and_validates_as_a_hand_written_loop(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    train_set, val_set = Blobs(20, seed=1), Blobs(10, seed=2)
    seen_by_hook: list[int] = []

    from trainwright.hooks import Hook

    class ReadsTheLoop(Hook):
        def before_train(self, runner: Any) -> None:
            seen_by_hook.append(runner.train_loop.max_iters)

    runner = Runner(
        model=model,
        work_dir=str(tmp_path),
        train_dataloader=dict(
            batch_size=4,
            dataset=train_set,
            sampler=dict(type="DefaultSampler", shuffle=True),
            collate_fn=dict(type="default_collate"),
        ),
        optim_wrapper=dict(optimizer=dict(type=SGD, lr=0.1, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1),
        val_dataloader=dict(
            batch_size=4,
            dataset=val_set,
            sampler=dict(type="DefaultSampler", shuffle=False),
            collate_fn=dict(type="default_collate"),
        ),
        val_cfg=dict(),
        val_evaluator=dict(type=Accuracy),
        launcher="none",
        custom_hooks=[ReadsTheLoop()],
        default_hooks=dict(checkpoint=None),
    )
    assert runner.train_loop is not None and runner.train_loop.max_iters == 10  # exists before train(), as mmengine's
    seed = runner.seed
    trained = runner.train()
    assert trained is model and seen_by_hook == [10] and runner.epoch == 2 and runner.iter == 10
    # the sampler dict reached a real sampler: integer indices in DefaultSampler's order (randperm under seed + epoch)
    orders = [torch.randperm(20, generator=torch.Generator().manual_seed(seed + epoch)).tolist() for epoch in range(2)]
    assert all(type(i) is int for i in train_set.seen) and train_set.seen == orders[0] + orders[1]
    # a hand-written loop over the same order from the same weights ends with the same weights
    ref = MLP()
    ref.load_state_dict(start)
    opt = SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for order in orders:
        for b in range(0, 20, 4):
            x, y = default_collate([(train_set.x[i], train_set.y[i]) for i in order[b : b + 4]])
            loss = F.cross_entropy(ref.net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)
    # validation: compute_metrics' number, equal to the accuracy computed here
    expected = 100 * (ref.net(val_set.x).argmax(1) == val_set.y).sum().item() / 10
    metrics = runner.val()
    assert metrics["val/accuracy"] == pytest.approx(expected)
    # mmengine's save_checkpoint(out_dir, filename): a training checkpoint there, no warning, weights only if asked
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner.save_checkpoint(tmp_path / "manual", "epoch_2.pth", save_optimizer=False)
    saved = torch.load(tmp_path / "manual" / "epoch_2.pth", weights_only=True)
    assert "optim_wrapper" not in saved and saved["progress"]["iteration"] == 10
    torch.testing.assert_close(saved["model"]["net.0.weight"], model.net[0].weight.detach(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="meta=.*not supported"):
        runner.save_checkpoint(tmp_path / "manual", "x.pth", meta=dict(a=1))
    runner.close()


def test_runner_from_cfg_and_its_refusals(tmp_path: Path) -> None:
    cfg = dict(
        model=MLP(),
        work_dir=str(tmp_path),
        data_root="helper variable",
        val_dataloader=dict(
            batch_size=5,
            dataset=Blobs(10, seed=2),
            sampler=dict(type="DefaultSampler", shuffle=False),
            collate_fn=dict(type="default_collate"),
        ),
        val_evaluator=dict(type=Accuracy, prefix="mlp"),
        val_cfg=dict(type="ValLoop"),
    )
    runner = Runner.from_cfg(cfg)
    assert runner.cfg is cfg and runner.train_loop is None
    assert set(runner.val()) == {"val/mlp/accuracy"}
    runner.close()
    with pytest.raises(ValueError, match=r"launcher='pytorch' but this process was not started by it .*torchrun"):
        Runner(model=MLP(), work_dir=str(tmp_path), launcher="pytorch")
    with pytest.raises(ValueError, match=r"launcher='torchrun': use one of"):
        Runner(model=MLP(), work_dir=str(tmp_path), launcher="torchrun")
