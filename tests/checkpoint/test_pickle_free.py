"""Every piece of a trainwright checkpoint is tensors and plain containers: ``torch.load(weights_only=True)`` reads it
with torch's default allowlist, nothing added (issue 39)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.checkpoint.inspect import walk
from trainwright.hooks import EarlyStoppingHook, EMAHook, SWAHook

PLAIN = (str, int, float, bool, type(None), torch.Tensor)
CONTAINERS = (dict, OrderedDict, list, tuple, set)


class Clf(tw.BaseModel):
    """4 → 3 linear classifier with BatchNorm (buffers too)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.bn = nn.BatchNorm1d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.fc(self.bn(x))
        if mode == "loss":
            return {"loss": F.cross_entropy(out, y)}
            return out
        return out


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(2)
    return TensorDataset(torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g))


def _trainer(work: Path, hooks: list[Any], **kwargs: Any) -> tw.Trainer:
    return tw.Trainer(
        model=Clf(),
        work_dir=work,
        train_dataloader=DataLoader(_data(), batch_size=4, shuffle=True),
        val_dataloader=DataLoader(_data(), batch_size=6),
        val_evaluator=tw.evaluation.Accuracy(),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01), clip_grad=dict(max_norm=1.0)),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.5, by_epoch=False, begin=0, end=3),
            dict(type="CosineAnnealingLR", T_max=2, by_epoch=True, begin=0, end=2),
        ],
        train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1),
        default_hooks=dict(checkpoint=dict(interval=1, save_best="val/acc", rule="greater")),
        custom_hooks=hooks,
        randomness=dict(seed=3),
        log_level="WARNING",
        **kwargs,
    )


def _assert_plain(ckpt: dict[str, Any], where: Path) -> None:
    for key, leaf in walk(ckpt):
        assert (
            type(leaf) in PLAIN
            or isinstance(leaf, torch.Tensor)
            or (type(leaf) in CONTAINERS and all(type(v) in PLAIN for v in leaf))
        ), f"{where}: {key} is a {type(leaf).__module__}.{type(leaf).__qualname__}"


@pytest.mark.parametrize(
    "hooks, extra",
    [
        ([EMAHook(momentum=0.5), EarlyStoppingHook(monitor="val/acc", patience=5)], dict(spike_guard=dict(window=4))),
        ([SWAHook(begin_epoch=1, swa_lr=0.01)], {}),
    ],
    ids=["ema-early-stopping-spike-guard", "swa"],
)
def test_every_piece_loads_with_weights_only_and_no_allowlist(tmp_path: Path, hooks: list[Any], extra: Any) -> None:
    with _trainer(tmp_path, hooks, **extra) as t:
        t.train()
        pieces = set(t.checkpoints.stateful)
    added = torch.serialization.get_safe_globals()  # torch.distributed.tensor adds its own DTensor types on import
    assert not [g for g in added if not getattr(g, "__module__", "").startswith("torch.")]  # trainwright adds none
    files = sorted((tmp_path / "checkpoints").glob("*.pth"))
    assert {f.name for f in files} >= {"epoch_1.pth", "epoch_2.pth"}
    torch.serialization.clear_safe_globals()  # torch's built-in allowlist only
    try:
        for f in files:
            ckpt = torch.load(f, weights_only=True)
            _assert_plain(ckpt, f)
            assert set(ckpt) == pieces  # every piece is in the file
    finally:
        torch.serialization.add_safe_globals(added)
    ckpt = torch.load(tmp_path / "checkpoints" / "epoch_2.pth", weights_only=True)
    hook_states = ckpt["hooks"]
    assert {type(h).__name__ for h in hooks} <= set(hook_states)  # each stateful hook saved its state
    assert len(ckpt["param_schedulers"]) == 2 and ckpt["optim_wrapper"]["optimizer"]["state"]
    assert ckpt["meta"]["format_version"] == 1 and ckpt["meta"]["torch_version"] == str(torch.__version__)
