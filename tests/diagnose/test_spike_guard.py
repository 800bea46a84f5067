"""Spike guard: a batch with a huge target at known iterations is skipped (or rolled back over); weights equal a
reference loop.

Data: 64 samples, batch 4, shuffle=False (16 iterations per epoch, 2 epochs); the targets of
batch 11 (samples 44..47) are 1e4, so iterations 12 and 28 spike. The reference is a
hand-written SGD loop over the same batches that skips the updates the design promises to skip:
bitwise equal (the same ops in the same order, one process).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import LinearReg, train_records
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.registry import ConfigError

SPIKES = (12, 28)


def _data(spiky_batches: tuple[int, ...] = (11,)) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.randn(4, 1, generator=g) + 0.1 * torch.randn(64, 1, generator=g)
    for b in spiky_batches:
        y[4 * b : 4 * b + 4] = 1e4
    return TensorDataset(x, y)


def _reference(skipped: set[int], momentum: float = 0.9, spiky_batches: tuple[int, ...] = (11,)) -> list[torch.Tensor]:
    model = LinearReg()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=momentum)
    x, y = _data(spiky_batches).tensors
    it = 0
    for _ in range(2):
        for b in range(16):
            it += 1
            if it in skipped:
                continue
            loss = F.mse_loss(model(x[4 * b : 4 * b + 4]), y[4 * b : 4 * b + 4])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [p.detach() for p in model.parameters()]


def _trainer(
    work_dir: Path, spike_guard: Any, checkpoint: Any = None, spiky_batches: tuple[int, ...] = (11,), **kwargs: Any
) -> tw.Trainer:
    return tw.Trainer(
        model=LinearReg(),
        work_dir=work_dir,
        train_dataloader=DataLoader(_data(spiky_batches), batch_size=4, shuffle=False),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.02, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        default_hooks=dict(checkpoint=checkpoint, logger=dict(interval=4)),
        randomness=dict(seed=0),
        log_level="WARNING",
        spike_guard=spike_guard,
        **kwargs,
    )


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_skip_equals_a_loop_that_skipped_those_updates(tmp_path: Path) -> None:
    t = _trainer(tmp_path, dict(window=8, threshold=6.0, action="skip"))
    model = t.train()
    assert _equal([p.detach() for p in model.parameters()], _reference(set(SPIKES)))
    assert not _equal(
        [p.detach() for p in model.parameters()], _reference(set())
    )  # the spikes would have changed the weights
    assert t.spike_guard is not None and t.spike_guard.skipped == 2
    log = (t.run_dir / "train.log").read_text()
    assert (
        "Loss spike at iteration 12" in log and "Loss spike at iteration 28" in log and "its update is skipped" in log
    )
    records = train_records(t.run_dir)
    assert [r["spike_skipped"] for r in records if r["iter"] in (8, 16, 32)] == [0, 1, 2]
    t.close()


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_rollback_equals_a_loop_that_never_saw_the_skipped_batches(tmp_path: Path, source: str) -> None:
    # memory: captures at 0, 5, 10, ...; disk: checkpoints at 5, 10, ... -> back to 10 (spike 12) and to 25 (spike 28)
    guard = dict(
        window=8,
        threshold=6.0,
        action="rollback",
        max_rollbacks=2,
        **({"capture_every": 5} if source == "memory" else {}),
    )
    t = _trainer(tmp_path, guard, checkpoint=dict(interval=5, by_epoch=False) if source == "disk" else None)
    model = t.train()
    assert _equal([p.detach() for p in model.parameters()], _reference({11, 12, 26, 27, 28}))
    assert t.progress.iteration == 32 and t.spike_guard is not None and t.spike_guard.rollbacks == 2
    log = (t.run_dir / "train.log").read_text()
    assert "spike_guard rolled back to iteration 10" in log and "iterations 11..12 run again without updates" in log
    assert "spike_guard rolled back to iteration 25" in log
    iters = [r["iter"] for r in train_records(t.run_dir)]
    assert iters == sorted(set(iters)), (
        iters
    )  # an iteration logged before the rollback gets no second record when it runs again
    t.close()


def test_repeated_rollbacks_to_one_capture_equal_a_loop_restoring_it_each_time(tmp_path: Path) -> None:
    # batches 11 and 13 spike: iterations 12, 14, 28, 30. Captures at 0, 10, 20: 12 and 14 both go back to 10,
    # 28 and 30 both to 20. The capture must be unchanged by the steps run after the first restore (13, 29).
    guard = dict(window=8, threshold=6.0, action="rollback", max_rollbacks=4, capture_every=10)
    t = _trainer(tmp_path, guard, spiky_batches=(11, 13))
    model = t.train()
    expected = _reference(set(range(11, 15)) | set(range(21, 31)), spiky_batches=(11, 13))
    assert _equal([p.detach() for p in model.parameters()], expected)
    assert t.spike_guard is not None and t.spike_guard.rollbacks == 4
    log = (t.run_dir / "train.log").read_text()
    assert (
        log.count("spike_guard rolled back to iteration 10") == 2
        and log.count("spike_guard rolled back to iteration 20") == 2
    )
    t.close()


def test_a_rollback_to_the_spikes_own_checkpoint_spends_nothing(tmp_path: Path) -> None:
    # checkpoints every 4 iterations: the newest one at a spike (12, 28) is the spike's own, written after its update
    # was skipped
    t = _trainer(
        tmp_path,
        dict(window=8, threshold=6.0, action="rollback", max_rollbacks=1),
        checkpoint=dict(interval=4, by_epoch=False),
    )
    model = t.train()
    assert _equal([p.detach() for p in model.parameters()], _reference(set(SPIKES)))
    assert t.spike_guard is not None and t.spike_guard.rollbacks == 0 and t.progress.iteration == 32
    log = (t.run_dir / "train.log").read_text()
    assert "is of the spike's own iteration 12" in log and "no rollback spent" in log and "rolled back to" not in log
    t.close()


def test_rollback_past_max_rollbacks_is_a_clear_error(tmp_path: Path) -> None:
    t = _trainer(tmp_path, dict(window=8, action="rollback", max_rollbacks=1, capture_every=5))
    with pytest.raises(
        RuntimeError, match=r"Loss spike at iteration 28 .*after 1 rollback\(s\): spike_guard max_rollbacks=1 is spent"
    ):
        t.train()
    t.close()
    log = (t.run_dir / "train.log").read_text()
    assert log.count("Stopped by SpikeRollbackError") == 1  # an error raised on every rank is logged once
    assert "no rollback left" in log


def test_rollback_without_a_checkpoint_fails_before_training(tmp_path: Path) -> None:
    t = _trainer(tmp_path, dict(action="rollback"))
    with pytest.raises(
        ValueError, match="no checkpoint to roll back to: there is no CheckpointHook.*capture_every=500"
    ):
        t.train()
    assert t.progress.iteration == 0
    t.close()


def test_unknown_key_is_a_config_error_with_did_you_mean(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Unknown spike_guard key 'treshold'.*threshold"):
        _trainer(tmp_path, dict(treshold=5.0))
    with pytest.raises(ConfigError, match="Unknown spike_guard key 'windw'.*window"):  # as a config key
        tw.Trainer.from_config(dict(model=LinearReg(), work_dir=str(tmp_path), spike_guard=dict(windw=100)))
    with pytest.raises(ValueError, match="action must be 'skip' or 'rollback'"):
        _trainer(tmp_path, dict(action="rollbak"))


class _StopAt(tw.Hook):
    def __init__(self, at: int) -> None:
        self.at = at

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        if trainer.progress.iteration == self.at:
            trainer.should_stop = True


def test_resume_with_the_guard_equals_uninterrupted(tmp_path: Path) -> None:
    guard = dict(window=8, threshold=6.0, action="skip")
    ckpt = dict(interval=4, by_epoch=False)
    full = _trainer(tmp_path / "full", guard, ckpt)
    ref = [p.detach().clone() for p in full.train().parameters()]
    ref_state = full.spike_guard.state_dict()  # type: ignore[union-attr]
    full.close()
    first = _trainer(tmp_path / "cut", guard, ckpt, custom_hooks=[_StopAt(20)])
    first.train()
    first.close()
    second = _trainer(tmp_path / "cut", guard, ckpt, resume=True)
    out = [p.detach() for p in second.train().parameters()]
    assert _equal(out, ref) and second.spike_guard.state_dict() == ref_state  # type: ignore[union-attr]
    second.close()
