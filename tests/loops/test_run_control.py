"""The loop's run control: a hook's stop with a reason, and a restart from a state the hook restored, against
hand-written loops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from conftest import LinearReg, make_trainer, regression_set

import trainwright as tw

LR = 0.05  # make_trainer's SGD


def _by_hand(steps: int) -> list[torch.Tensor]:
    """Plain SGD over the first ``steps`` batches of 2 (make_trainer's data, unshuffled)."""
    model = LinearReg()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = regression_set().tensors
    for b in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x[2 * b : 2 * b + 2]), y[2 * b : 2 * b + 2]).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


class StopAt(tw.Hook):
    def __init__(self, at: int) -> None:
        self.at = at

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        if trainer.progress.iteration == self.at:
            trainer.train_loop.control.request_stop(f"test stop at {self.at}")


class RestartOnce(tw.Hook):
    """Keeps the state of iteration ``keep``; at ``at`` puts it back and has the loop go on from there (once)."""

    def __init__(self, keep: int, at: int) -> None:
        self.keep, self.at, self.seen = keep, at, []
        self.captured: Any = None
        self.restarted = False

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        it = trainer.progress.iteration
        self.seen.append(it)
        if it == self.keep and self.captured is None:
            self.captured = trainer.checkpoints.capture()
        elif it == self.at and not self.restarted:
            trainer.checkpoints.restore_captured(self.captured)
            self.restarted = True
            trainer.train_loop.restart_from(trainer.progress.iteration)


def test_a_stop_with_a_reason_ends_after_that_iteration_and_a_restart_runs_the_restored_iterations_again(
    tmp_path: Path,
) -> None:
    t = make_trainer(tmp_path / "stop", custom_hooks=[StopAt(3)])
    model = t.train()
    assert t.progress.iteration == 3
    assert t.train_loop.control.stop_reason == "test stop at 3"
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), _by_hand(3), strict=True))
    t.close()

    hook = RestartOnce(keep=2, at=4)
    t = make_trainer(tmp_path / "restart", custom_hooks=[hook])  # 10 batches, one epoch
    model = t.train()
    assert hook.seen == [
        1,
        2,
        3,
        4,
        3,
        4,
        5,
        6,
        7,
        8,
        9,
        10,
    ]  # 3 and 4 ran again from the restored state, then the epoch went on
    assert t.progress.iteration == 10 and t.progress.epoch == 1
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), _by_hand(10), strict=True)
    )  # restored exactly: as if uninterrupted
    t.close()
