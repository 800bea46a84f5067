"""Update guards: a guard written here, appended to ``OptimWrapper.update_guards``, skips exactly what a hand-written
loop skips.

The guard skips every micro-batch whose loss is above a limit. The data make batches 3 and 6
(of 10, batch 2) far off, so their loss is above it. The reference is a plain SGD loop with
accumulation over the same batches: a skipped micro-batch is not back-propagated and, for a
guard that ``skips_window``, its window is not stepped; bitwise equal (same ops, same order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import LinearReg, make_trainer
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.optim import OptimWrapper

LIMIT = 1e3
FAR = (3, 6)  # batches whose targets are far off: their loss is above LIMIT


class AboveLimit:
    """Skips a micro-batch whose loss is above ``limit`` (a guard of a user's own: no trainwright base class)."""

    def __init__(self, limit: float, skips_window: bool) -> None:
        self.limit = limit
        self.skips_window = skips_window
        self.asked = 0

    def check(self, loss: torch.Tensor) -> bool:
        self.asked += 1
        return float(loss.detach()) > self.limit


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(20, 4, generator=g)
    y = x @ torch.randn(4, 1, generator=g)
    for b in FAR:
        y[2 * b : 2 * b + 2] = 1e3
    return TensorDataset(x, y)


def _reference(acc: int, skips_window: bool) -> list[torch.Tensor]:
    """SGD over the 10 batches, ``acc`` micro-batches per update, the FAR ones left out (and their window, if
    ``skips_window``)."""
    model = LinearReg()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = _data().tensors
    skip_window = False
    for b in range(10):
        loss = F.mse_loss(model(x[2 * b : 2 * b + 2]), y[2 * b : 2 * b + 2])
        if b in FAR:
            skip_window = skip_window or skips_window
        else:
            (loss / acc if acc > 1 else loss).backward()
        if (b + 1) % acc == 0:
            if not skip_window:
                opt.step()
            opt.zero_grad()
            skip_window = False
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("acc, skips_window", [(1, False), (2, False), (2, True)])
def test_a_guard_in_the_public_list_equals_a_loop_skipping_those_updates(acc: int, skips_window: bool) -> None:
    model = LinearReg()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), accumulative_counts=acc)
    guard = AboveLimit(LIMIT, skips_window)
    ow.update_guards.append(guard)
    ow.initialize_count_status(model, 0, 10)
    x, y = _data().tensors
    for b in range(10):
        ow.update_params(F.mse_loss(model(x[2 * b : 2 * b + 2]), y[2 * b : 2 * b + 2]))
    assert guard.asked == 10
    ref = _reference(acc, skips_window)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref, strict=True))
    unguarded = _reference(acc, skips_window=False) if skips_window else None
    assert unguarded is None or not all(torch.equal(a, b) for a, b in zip(model.parameters(), unguarded, strict=True))


def test_a_guard_added_by_a_hook_skips_in_a_trainer_run_and_comes_after_skip_nonfinite(tmp_path: Path) -> None:
    guard = AboveLimit(LIMIT, skips_window=False)

    class AddGuard(tw.Hook):
        def before_train(self, trainer: Any) -> None:
            trainer.optim_wrapper.update_guards.append(guard)

    t = make_trainer(
        tmp_path,
        model=LinearReg(),
        train_dataloader=DataLoader(_data(), batch_size=2, shuffle=False),
        custom_hooks=[AddGuard()],
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01, momentum=0.9)),
        nonfinite_loss="skip",
    )
    model = t.train()
    assert guard.asked == 10
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), _reference(1, False), strict=True))
    ow = t.optim_wrapper
    assert (
        ow.skip_nonfinite and len(ow.update_guards) == 2 and ow.update_guards[-1] is guard
    )  # after the trainer's own, as registered
    t.close()
