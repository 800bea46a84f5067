"""Where a NaN came from: the FloatingPointError names the first non-finite module / gradient, the iteration and the
batch.

A model of three blocks; a marker sample in one batch makes ``blocks.2`` output inf (forward
variant) or gives ``blocks.1.gate`` a NaN gradient with every forward value finite (gradient
variant: the loss turns NaN one iteration later). The loss is found non-finite at the logger's
flush before the checkpoint of iteration 8, after the weights were updated with it; the error names what the replay
from the checkpoint before it found.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw

MARKER_AT = 7  # iteration whose batch holds the marker sample (batch 6: samples 24..27, shuffle=False, batch_size=4)
MARKER_SAMPLE = 25


class Block(nn.Module):
    def __init__(self, d: int, fragile: str = "") -> None:
        super().__init__()
        self.linear = nn.Linear(d, d)
        self.fragile = fragile
        self.gate = nn.Parameter(torch.ones(()))

    def forward(self, h: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
        out = torch.tanh(self.linear(h))
        if self.fragile == "forward":  # inf output on the marker batch, finite inputs
            out = out * torch.where(bad, torch.tensor(float("inf")), torch.tensor(1.0))
        elif self.fragile == "grad":  # finite output; d/d gate = 0 * inf on the marker batch
            out = out + (self.gate * torch.where(bad, 0.0, 1.0)).sqrt() * 0
        return out


class Net(tw.BaseModel):
    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            [Block(4), Block(4, "grad" if kind == "grad" else ""), Block(4, "forward" if kind == "forward" else "")]
        )
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        bad = x.abs().amax() > 50  # the marker (no host read)
        h = x.clamp(-5, 5)
        for blk in self.blocks:
            h = blk(h, bad)
        out = self.head(h)
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 4, generator=g)
    x[MARKER_SAMPLE, 0] = 1000.0
    return TensorDataset(x, torch.randn(40, 1, generator=g))


def _train(tmp_path: Path, kind: str, checkpoint: Any, **kwargs: Any) -> tuple[str, tw.Trainer]:
    t = tw.Trainer(
        model=Net(kind),
        work_dir=tmp_path,
        train_dataloader=DataLoader(_data(), batch_size=4, shuffle=False),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05), **kwargs),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        default_hooks=dict(logger=dict(interval=5), checkpoint=checkpoint),
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    with pytest.raises(FloatingPointError) as err:
        t.train()
    return str(err.value), t


CKPT = dict(interval=4, by_epoch=False)


def test_forward_inf_names_the_block_the_iteration_and_the_batch(tmp_path: Path) -> None:
    msg, t = _train(tmp_path, "forward", CKPT)
    assert f"Loss became infinite or NaN at iteration {MARKER_AT}" in msg
    assert "batch 6 of epoch 1's data order" in msg and "dataset indices [24, 25, 26, 27]" in msg
    assert "Replayed iterations 5..7 from" in msg and "iter_4.pth" in msg
    assert (
        "the first module whose forward output was non-finite is module 'blocks.2' (Block); its inputs were finite"
        in msg
    )
    # the trainer is put back as it was at detection: the flush before the checkpoint of iteration 8
    assert t.progress.iteration == 8
    assert not all(torch.isfinite(p).all() for p in t.unwrapped_model.parameters())
    log = (t.run_dir / "train.log").read_text()
    assert "module 'blocks.2'" in log.splitlines()[-1]
    t.close()


def test_a_nan_gradient_before_any_nan_output_is_named(tmp_path: Path) -> None:
    msg, t = _train(tmp_path, "grad", CKPT)
    assert (
        f"Loss became infinite or NaN at iteration {MARKER_AT + 1}" in msg
    )  # the NaN gradient's update turns the next loss NaN
    assert f"the first non-finite value appears at iteration {MARKER_AT}, before the loss turned non-finite" in msg
    assert "dataset indices [24, 25, 26, 27]" in msg
    assert "the first non-finite gradient of the backward pass is that of parameter 'blocks.1.gate'" in msg
    assert "first module whose forward output" not in msg
    t.close()


def test_weights_still_finite_replay_batch_k_on_them(tmp_path: Path) -> None:
    # accumulation over 4: the NaN of iteration 5 is found at 6 (the flush before its checkpoint), inside its window
    # 5..8
    g = _data()
    g.tensors[0][MARKER_SAMPLE, 0] = 0.0
    g.tensors[0][17, 0] = 1000.0  # iteration 5: batch 4, samples 16..19
    t = tw.Trainer(
        model=Net("forward"),
        work_dir=tmp_path,
        train_dataloader=DataLoader(g, batch_size=4, shuffle=False),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05), accumulative_counts=4),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(logger=dict(interval=5), checkpoint=dict(interval=6, by_epoch=False)),
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    with pytest.raises(FloatingPointError) as err:
        t.train()
    msg = str(err.value)
    assert (
        "at iteration 5" in msg
        and "batch 4 of epoch 1's data order" in msg
        and "dataset indices [16, 17, 18, 19]" in msg
    )
    assert (
        "Replayed the batch on the current weights (still finite: the update after it was not taken" in msg
        and "module 'blocks.2' (Block)" in msg
    )
    t.close()


def test_no_state_before_k_says_so_and_names_the_nonfinite_parameters(tmp_path: Path) -> None:
    msg, t = _train(tmp_path, "forward", None)
    assert f"at iteration {MARKER_AT}" in msg and "dataset indices [24, 25, 26, 27]" in msg
    assert "No state from before iteration 7 to replay from" in msg and "blocks.2.linear.weight" in msg
    t.close()


@pytest.mark.parametrize("accumulate", [1, 4])
def test_a_stream_without_a_length_names_the_batch_by_iteration_and_replays_from_a_checkpoint(
    tmp_path: Path, accumulate: int
) -> None:
    # an endless Mixture (no len()): the diagnosis failed with "Finding where it came from failed: TypeError". With
    # accumulation over 4 the weights are still finite at detection (iteration 7 is inside the window 5..8): the
    # stream's batch is read again by the replay from the checkpoint too
    from trainwright.data.mixture import Mixture

    t = tw.Trainer(
        model=Net("forward"),
        work_dir=tmp_path,
        train_dataloader=dict(dataset=Mixture([_data()], weights=[1], shuffle=False), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05), accumulative_counts=accumulate),
        train_cfg=dict(by_epoch=False, max_iters=12),
        default_hooks=dict(logger=dict(interval=5), checkpoint=CKPT),
        randomness=dict(seed=0),
        log_level="WARNING",
    )
    with pytest.raises(FloatingPointError) as err:
        t.train()
    msg = str(err.value)
    assert f"Loss became infinite or NaN at iteration {MARKER_AT}" in msg and "failed" not in msg, msg
    assert f"the stream's batch of iteration {MARKER_AT}" in msg
    assert "Replayed iterations 5..7 from" in msg and "iter_4.pth" in msg
    assert "module 'blocks.2' (Block); its inputs were finite" in msg
    t.close()
