"""The hot loop never pulls a tensor to the host outside logging iterations.

We count every call of the Tensor methods that force a device→host transfer (``item``,
``cpu``, ``tolist``, ``numpy``, ``__bool__``, ``__float__``, ``__int__``, ``__index__``)
while a real training run proceeds, attributing each call to the iteration it happens in.
Only logging iterations (every ``interval``; with ``flush_secs=0`` each of them flushes the
metric store) may have any. This is instrumentation of
torch, not of trainwright: the engine runs unmodified.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw


class Net(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.mlp(x)
        if mode == "loss":
            return {"loss": F.cross_entropy(out, y), "loss_aux": out.pow(2).mean() * 1e-3}
        return out


class SyncPerIter(tw.Hook):
    """Snapshots the counter around each iteration (highest and lowest priority copies)."""

    def __init__(self, counter: Counter[str], per_iter: dict[int, int], edge: str) -> None:
        self.counter = counter
        self.per_iter = per_iter
        self.edge = edge
        self.priority = 0 if edge == "start" else 100  # type: ignore[misc]
        self.state_key = f"SyncPerIter{edge}"

    def before_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None) -> None:
        if self.edge == "start":
            self.per_iter["_start"] = self.counter.total()

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        if self.edge == "end":
            self.per_iter[trainer.progress.iteration] = self.counter.total() - self.per_iter["_start"]


@pytest.mark.parametrize("by_epoch", [True, False])
def test_zero_syncs_in_non_logging_iterations(tmp_path: Any, sync_calls: Counter[str], by_epoch: bool) -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g))
    per_iter: dict[int, int] = {}
    interval = 5
    train_cfg = dict(by_epoch=True, max_epochs=2) if by_epoch else dict(by_epoch=False, max_iters=24)
    trainer = tw.Trainer(
        model=Net(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(data, batch_size=8, shuffle=True),
        optim_wrapper=dict(
            optimizer=dict(type="SGD", lr=0.1, momentum=0.9), accumulative_counts=2, clip_grad=dict(max_norm=1.0)
        ),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=10),
            dict(type="CosineAnnealingLR", by_epoch=False, begin=10, end=24),
        ],
        train_cfg=train_cfg,
        # flush_secs=0: every line written at once; the norms hook measures the steps of iterations 3, 6, 9... (with
        # windows of 2:
        # steps 4, 6, 10...), most of them in non-logging iterations: its numbers wait on the device for the store's
        # flush
        default_hooks=dict(
            logger=dict(interval=interval, flush_secs=0),
            checkpoint=dict(interval=12, by_epoch=False),
            norms=dict(interval=3),
        ),
        custom_hooks=[
            SyncPerIter(sync_calls, per_iter, "start"),
            SyncPerIter(sync_calls, per_iter, "end"),
            dict(type="EMAHook"),
        ],
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    trainer.train()
    trainer.close()
    from conftest import train_records

    assert any(
        k.startswith("update_ratio/") for r in train_records(trainer.run_dir) for k in r
    )  # the norms hook measured steps
    per_iter.pop("_start")
    assert len(per_iter) == 24
    epoch_len = 12
    # the logger's interval counts within the epoch in an epoch-based run (mmengine's); the epoch's last iteration logs
    # too
    logging_iters = {
        i
        for i in per_iter
        if (((i - 1) % epoch_len + 1) % interval == 0 or i % epoch_len == 0 if by_epoch else i % interval == 0)
    }
    checkpoint_iters = {12, 24}  # checkpoints copy state to the host by design
    quiet = {i: n for i, n in per_iter.items() if i not in logging_iters | checkpoint_iters}
    assert quiet and all(n == 0 for n in quiet.values()), f"host syncs in non-logging iterations: {quiet}"
    # The instrument works: logging iterations do transfer.
    assert any(per_iter[i] > 0 for i in logging_iters)


class _SyncDebugWindow(tw.Hook):
    """Turns ``torch.cuda.set_sync_debug_mode("error")`` on for the iterations in ``quiet`` (first hook in)."""

    priority = "HIGHEST"

    def __init__(self, quiet: set[int]) -> None:
        self.quiet = quiet
        self.checked: list[int] = []

    def before_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None) -> None:
        if trainer.progress.iteration + 1 in self.quiet:
            self.checked.append(trainer.progress.iteration + 1)
            torch.cuda.set_sync_debug_mode("error")


class _SyncDebugOff(tw.Hook):
    """Turns it off again at the end of every iteration (last hook out)."""

    priority = "LOWEST"

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
def test_cuda_non_logging_iterations_pass_sync_debug_error(tmp_path: Any, precision: str) -> None:
    """On a GPU, non-logging iterations run under ``set_sync_debug_mode("error")``: any sync raises.

    Pinned batches copied with ``non_blocking=True`` (a pageable host→device copy synchronises
    by design). float16 is left out: ``torch.amp.GradScaler.step`` reads its inf check on the
    host every step (PyTorch's design, not the engine's).
    """
    from trainwright.model import BaseDataPreprocessor

    class CudaNet(Net):
        def __init__(self) -> None:
            super().__init__()
            self.data_preprocessor = BaseDataPreprocessor(non_blocking=True)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(192, 8, generator=g), torch.randint(0, 3, (192,), generator=g))
    interval = 5
    # After two warm-up iterations (CUDA / cuBLAS set-up), before the epoch's last one (the logger flushes there).
    quiet = {i for i in range(3, 24) if i % interval != 0}
    window = _SyncDebugWindow(quiet)
    trainer = tw.Trainer(
        model=CudaNet(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(data, batch_size=8, shuffle=True, pin_memory=True),
        optim_wrapper=dict(
            optimizer=dict(type="SGD", lr=0.1, momentum=0.9), accumulative_counts=2, clip_grad=dict(max_norm=1.0)
        ),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        precision=precision,
        default_hooks=dict(
            logger=dict(interval=interval, flush_secs=0), norms=dict(interval=3)
        ),  # norms measured in quiet iterations too
        custom_hooks=[window, _SyncDebugOff()],
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    try:
        trainer.train()  # a synchronising call inside a quiet iteration raises RuntimeError here
    finally:
        torch.cuda.set_sync_debug_mode("default")
        trainer.close()
    assert trainer.strategy.device.type == "cuda" and sorted(window.checked) == sorted(quiet)
