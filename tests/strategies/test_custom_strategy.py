"""A strategy written against the public interface (no internals of the optim wrapper or the Trainer) trains and
checkpoints."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from conftest import LinearReg, regression_set
from torch import nn
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.optim import OptimWrapper
from trainwright.strategies import SingleDeviceStrategy


class LedgerStrategy(SingleDeviceStrategy):
    """Keeps a ledger of every update it carries out, and skips "gradient sync" inside windows (a no_sync it counts).

    Only the strategy interface is used: ``backward`` / ``clip_grad`` / ``optimizer_step`` run the
    default one-process behaviour through ``super()``, ``no_sync_context`` is a capability.
    """

    name = "ledger"

    def __init__(self) -> None:
        super().__init__("cpu")
        self.ledger: list[str] = []

    def backward(self, loss: torch.Tensor, optim_wrapper: OptimWrapper, **kwargs: Any) -> None:
        self.ledger.append("backward")
        super().backward(loss, optim_wrapper, **kwargs)

    def clip_grad(
        self, clip: Callable[[list[torch.Tensor]], torch.Tensor], params: list[torch.Tensor]
    ) -> torch.Tensor | None:
        self.ledger.append("clip")
        return super().clip_grad(clip, params)

    def optimizer_step(self, optim_wrapper: OptimWrapper, **kwargs: Any) -> None:
        self.ledger.append("step")
        super().optimizer_step(optim_wrapper, **kwargs)

    def no_sync_context(self) -> Callable[[nn.Module], contextlib.AbstractContextManager]:
        @contextlib.contextmanager
        def no_sync(model: nn.Module) -> Iterator[None]:
            self.ledger.append("no_sync")
            yield

        return no_sync


def _trainer(work_dir: Path, strategy: LedgerStrategy, model: nn.Module, max_epochs: int, **kwargs: Any) -> tw.Trainer:
    return tw.Trainer(
        model=model,
        work_dir=work_dir,
        strategy=strategy,
        randomness=dict(seed=0),
        log_level="WARNING",
        train_dataloader=DataLoader(regression_set(12), batch_size=2),  # 6 batches: windows of 2
        optim_wrapper=dict(
            optimizer=dict(type="SGD", lr=0.05, momentum=0.9), accumulative_counts=2, clip_grad=dict(max_norm=0.5)
        ),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        default_hooks=dict(checkpoint=dict(interval=1)),
        **kwargs,
    )


def _reference(model: nn.Module, epochs: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = list(DataLoader(regression_set(12), batch_size=2))
    for _ in range(epochs):
        for i, (x, y) in enumerate(batches):
            (F.mse_loss(model.linear(x), y) / 2).backward()
            if i % 2 == 1:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                opt.zero_grad()


def test_a_strategy_of_the_public_interface_carries_out_every_update(tmp_path: Path) -> None:
    model = LinearReg()
    ref = copy.deepcopy(model)
    strategy = LedgerStrategy()
    with _trainer(tmp_path, strategy, model, max_epochs=1) as trainer:
        trainer.train()
        assert trainer.optim_wrapper.strategy is strategy
    _reference(ref, 1)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # per window of 2: the first micro-batch skips sync, both back-propagate, then clip and step
    assert strategy.ledger == ["no_sync", "backward", "backward", "clip", "step"] * 3


def test_a_strategy_of_the_public_interface_checkpoints_and_resumes_bitwise(tmp_path: Path) -> None:
    full = LinearReg()
    with _trainer(tmp_path / "full", LedgerStrategy(), full, max_epochs=3) as trainer:
        trainer.train()
    first = LinearReg()
    with _trainer(tmp_path / "cut", LedgerStrategy(), first, max_epochs=2) as trainer:
        trainer.train()
    assert (tmp_path / "cut" / "checkpoints" / "epoch_2.pth").is_file()
    resumed = LinearReg(seed=5)  # other weights: everything comes from the checkpoint
    strategy = LedgerStrategy()
    with _trainer(tmp_path / "cut", strategy, resumed, max_epochs=3, resume=True) as trainer:
        trainer.train()
        assert trainer.progress.epoch == 3
    assert strategy.ledger.count("step") == 3  # one epoch of 3 updates after the resume
    for a, b in zip(resumed.parameters(), full.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_a_cuda_device_without_an_index_means_this_process_gpu(monkeypatch: Any) -> None:
    """``device="cuda"`` gets the index torch.cuda.set_device needs (the local rank), without touching CUDA."""
    from trainwright.strategies import SingleDeviceStrategy

    assert SingleDeviceStrategy("cuda").device == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert SingleDeviceStrategy("cuda").device == torch.device("cuda", 1)
    assert SingleDeviceStrategy("cuda:0").device == torch.device("cuda", 0)
