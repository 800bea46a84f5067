"""Every ```python block of docs/ runs, in order, one namespace per page (the README's: test_readme_example.py).

A page's blocks start from a prelude holding what a reader has at hand: ``tw``, ``torch``,
``nn``, a small classification ``model`` (a ``tw.BaseModel``), ``optimizer``, ``optim_wrapper``,
``train_loader`` / ``loader`` / ``val_loader``, a ``batch``, and a ``trainer`` that has trained
one epoch. A call written ``tw.Trainer(..., key=value)`` gets the prelude's model, data and a
one-epoch schedule in place of the ``...`` (the block's own arguments win). A block that cannot run here is preceded by
an
HTML comment ``<!-- not run: why -->`` and is only compiled.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"(<!-- not run: [^>]*-->\s*\n)?```python[^\n]*\n(.*?)```", re.S)
ELIDED_ARGS = re.compile(r"([\w.]+)\((?:\s*model\s*,)?\s*\.\.\.\s*,")

PRELUDE = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright import Trainer


class Net(tw.BaseModel):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(4, 8)
        self.head = nn.Linear(8, 10)

    def forward(self, x, y=None, mode="tensor"):
        logits = self.head(torch.relu(self.backbone(x)))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, y)}
        return logits


_g = torch.Generator().manual_seed(0)
dataset = TensorDataset(torch.randn(32, 4, generator=_g), torch.randint(0, 10, (32,), generator=_g))
train_loader = loader = val_loader = DataLoader(dataset, batch_size=8)
batch = next(iter(train_loader))
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
optim_wrapper = tw.OptimWrapper(optimizer)
_BASE = dict(model=model, work_dir="work_dirs/docs", train_dataloader=train_loader, train_cfg=dict(by_epoch=True, max_epochs=1),
             optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)), default_hooks=dict(checkpoint=None))


def _with_base(build, **kwargs):
    return build(**{**_BASE, **kwargs})


trainer = tw.Trainer(**_BASE)
trainer.train()
"""


def _blocks(page: Path) -> list[tuple[bool, str]]:
    return [(not skip, code) for skip, code in BLOCK.findall(page.read_text(encoding="utf-8"))]


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p)], ids=lambda p: p.name)
def test_every_python_block_of_the_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"__name__": f"docs_{page.stem}"}
    exec(compile(PRELUDE, "prelude", "exec"), scope)  # noqa: S102 - our own documentation
    try:
        for i, (run, code) in enumerate(_blocks(page)):
            where = f"{page.relative_to(ROOT)} block {i + 1}"
            compiled = compile(ELIDED_ARGS.sub(r"_with_base(\1,", code), where, "exec")
            if run:
                try:
                    exec(compiled, scope)  # noqa: S102
                except Exception as e:
                    raise AssertionError(f"{where} fails: {type(e).__name__}: {e}\n{code}") from e
    finally:
        for value in list(scope.values()):
            if isinstance(value, scope["tw"].Trainer):
                value.close()
