"""Clipping by norm sums over the model's parameters in their order, whatever order the optimizer's groups hold them
in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.optim import OptimWrapper

STEPS, MAX_NORM = 12, 0.05


class MLP(tw.BaseModel):
    """8 → 32 → LayerNorm → 32 → 1 regression: weight matrices, biases and norm weights interleaved in
    ``parameters()``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 32)
        self.norm = nn.LayerNorm(32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.c(torch.relu(self.b(self.norm(torch.relu(self.a(x))))))
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def decay_groups(model: nn.Module) -> list[dict[str, Any]]:
    """nanoGPT's ``configure_optimizers``: matrices decay, vectors do not: two groups, not in the model's order."""
    params = list(model.parameters())
    return [
        dict(params=[p for p in params if p.dim() >= 2], weight_decay=0.1),
        dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0),
    ]


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(48, 8, generator=g), 5 * torch.randn(48, 1, generator=g))


def test_clipping_equals_clip_grad_norm_over_model_parameters_bitwise(tmp_path: Path) -> None:
    """A loop calling clip_grad_norm_(model.parameters(), max_norm) with decay / no-decay AdamW groups == the
    Trainer, bit for bit."""
    ref = MLP()
    opt = torch.optim.AdamW(decay_groups(ref), lr=1e-2)
    x, y = data().tensors
    norms = []
    for i in range(STEPS):
        j = (i * 8) % len(x)
        ref(x[j : j + 8], y[j : j + 8], mode="loss")["loss"].backward()
        norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM))
        opt.step()
        opt.zero_grad()
    assert all(n > MAX_NORM for n in norms)  # clipping acts at every step

    model = MLP()
    t = tw.Trainer(
        model=model,
        work_dir=tmp_path,
        train_dataloader=DataLoader(data(), batch_size=8),
        optim_wrapper=OptimWrapper(torch.optim.AdamW(decay_groups(model), lr=1e-2), clip_grad=dict(max_norm=MAX_NORM)),
        train_cfg=dict(by_epoch=False, max_iters=STEPS),
        default_hooks=dict(checkpoint=None),
        log_level="WARNING",
    )
    t.train()
    assert torch.equal(t.optim_wrapper.grad_norm, norms[-1])
    t.close()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
