"""PreciseBNHook (detectron2's PreciseBN): BatchNorm statistics become true averages at the final weights; training
is untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.hooks import PreciseBNHook


class BNDropNet(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.fc = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8, momentum=0.5)  # a large momentum: the running mean follows the last few batches
        self.head = nn.Sequential(nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.head(self.bn(self.fc(x)))
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 4, generator=g) * torch.linspace(0.2, 3.0, 64).unsqueeze(1) + 1  # batches of other scales
    return TensorDataset(x, (x[:, :1] * x[:, 1:2]).tanh())


def _train(work_dir: Path, hooks: list, **train_cfg: Any) -> tw.Trainer:
    trainer = tw.Trainer(
        model=BNDropNet(),
        work_dir=work_dir,
        train_dataloader=DataLoader(_data(), batch_size=8, shuffle=True),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        train_cfg=train_cfg or dict(by_epoch=True, max_epochs=3),
        custom_hooks=hooks,
        default_hooks=dict(checkpoint=None),
        log_level="WARNING",
        randomness=dict(seed=0),
    )
    trainer.train()
    return trainer


def test_statistics_are_the_training_sets_at_the_final_weights_and_training_is_unchanged(tmp_path: Path) -> None:
    plain = _train(tmp_path / "plain", [])
    precise = _train(tmp_path / "precise", [dict(type="PreciseBNHook", num_iter=200)])
    model, ref = precise.unwrapped_model, plain.unwrapped_model
    # training itself is untouched (its batches, dropout draws and weights): only the BatchNorm statistics differ
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), name
    assert precise.progress.iteration == plain.progress.iteration == 24
    with torch.no_grad():
        feats = model.fc(_data().tensors[0])  # the BatchNorm's inputs over the whole set, at the final weights
    # 200 batches asked, 8 in the set: each sample once, equal batches, so the running mean is the set's mean
    torch.testing.assert_close(model.bn.running_mean, feats.mean(0), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref.bn.running_mean, feats.mean(0), rtol=1e-2, atol=1e-2)  # the lagging running average
    assert model.bn.momentum == 0.5 and model.training is ref.training
    plain.close()
    precise.close()


def test_interval_and_iteration_based_runs(tmp_path: Path) -> None:
    counts: list[int] = []

    class Counting(PreciseBNHook):
        def recompute(self, trainer: Any) -> None:
            counts.append(trainer.progress.iteration)
            super().recompute(trainer)

    _train(tmp_path / "a", [Counting(num_iter=2, interval=2)], by_epoch=True, max_epochs=3).close()
    assert counts == [16, 24]  # after epoch 2 and the last epoch
    counts.clear()
    _train(tmp_path / "b", [Counting(num_iter=2, interval=5, by_epoch=False)], by_epoch=False, max_iters=12).close()
    assert counts == [5, 10, 12]
    with pytest.raises(
        ValueError,
        match=r"PreciseBNHook counts its interval in epochs \(by_epoch=True\) but training is iteration-based",
    ):
        _train(tmp_path / "c", [PreciseBNHook()], by_epoch=False, max_iters=4)
    with pytest.raises(ValueError, match="num_iter must be an int >= 1"):
        PreciseBNHook(num_iter=0)
