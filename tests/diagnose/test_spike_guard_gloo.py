"""Spike guard under 2 gloo processes: a spike on rank 1 only makes both ranks skip (DDP), or roll back (DDP and FSDP,
in memory
and from a sharded checkpoint on disk, also one still written in the background); weights equal across ranks, across
strategies
and to a reference loop.

One torchrun start runs the seven trainings (spike_rank_train.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from launch import launch

SCRIPT = Path(__file__).with_name("spike_rank_train.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
RUNS = [
    "skip:ddp:skip",
    "ddp_mem:ddp:rollback:capture=4:ema=1",
    "fsdp_mem:fsdp:rollback:capture=4:ema=1",
    "fsdp_disk:fsdp:rollback:save=4:ema=1",
    "fsdp_async:fsdp:rollback:save=4:async=1:ema=1",
    "ddp_accum:ddp:skip:accum=2",
    "fsdp_accum:fsdp:skip:accum=2",
]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("spike")
    launch(SCRIPT, [str(tmp / "out"), *RUNS], tmp, nproc=2, timeout=180)
    return tmp / "out"


def _results(out: Path, name: str) -> list[dict]:
    return [torch.load(out / name / f"rank{r}.pt") for r in range(2)]


def _reference(skipped_batches: tuple[int, ...], per_step: int = 1) -> dict[str, torch.Tensor]:
    """One process on the union of the ranks' batches (samples 8b..8b+7), the batches ``skipped_batches`` of each epoch
    not trained on.

    ``per_step``: batches per optimizer step (accumulation: one step on their union; ``skipped_batches`` then counts
    steps).
    """
    sys.path.insert(0, str(SCRIPT.parent))
    from spike_rank_train import Reg, data

    model = Reg()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    x, y = data().tensors
    n = 8 * per_step
    for _epoch in range(2):
        for b in range(8 // per_step):
            if b in skipped_batches:
                continue
            loss = F.mse_loss(model(x[n * b : n * b + n]), y[n * b : n * b + n])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def _assert_close(got: dict, ref: dict) -> None:
    assert got.keys() == ref.keys()
    for k, v in ref.items():
        torch.testing.assert_close(
            got[k], v, rtol=1e-5, atol=1e-6, msg=k
        )  # DDP's mean of two means vs one mean of 8: rounding only


def test_a_spike_on_one_rank_skips_the_update_on_both(out: Path) -> None:
    r0, r1 = _results(out, "skip")
    assert r0["skipped"] == r1["skipped"] == 2  # iteration 6 of each epoch
    assert all(torch.equal(r0["params"][k], r1["params"][k]) for k in r0["params"])
    _assert_close(r0["params"], _reference(skipped_batches=(5,)))


def test_rollback_under_fsdp_equals_ddp_in_memory_and_from_a_sharded_checkpoint(out: Path) -> None:
    """Spikes at iterations 6 and 14: each run goes back to iteration 4 / 12 (capture_every=4, or the .dcp checkpoints
    saved every 4)
    and skips the updates of 5-6 / 13-14. FSDP (every way) equals DDP bitwise; DDP equals one process skipping those
    batches.
    With async_save the checkpoint of iteration 4 is still being written at the spike: the rollback waits for it (it
    used to
    find none and stop the run, or go back to an older one). An EMAHook's average (sharded under FSDP) is rolled back
    with the
    weights: equal to DDP's bitwise too."""
    ddp = _results(out, "ddp_mem")
    assert all(torch.equal(ddp[0]["params"][k], ddp[1]["params"][k]) for k in ddp[0]["params"])
    for name in ("ddp_mem", "fsdp_mem", "fsdp_disk", "fsdp_async"):
        for rank, r in enumerate(_results(out, name)):
            assert (r["skipped"], r["rollbacks"], r["iteration"]) == (2, 2, 16), (name, rank, r)
    for name in ("fsdp_mem", "fsdp_disk", "fsdp_async"):
        fsdp = _results(out, name)[0]["params"]  # gathered on rank 0
        assert fsdp.keys() == ddp[0]["params"].keys()
        for k, v in ddp[0]["params"].items():
            assert torch.equal(fsdp[k], v), (name, k)
        ema = _results(out, name)[0]["ema"]
        assert ema.keys() == ddp[0]["ema"].keys() == {"linear.weight", "linear.bias"}
        for k, v in ddp[0]["ema"].items():
            assert torch.equal(ema[k], v), (name, "ema", k)
    for name in ("fsdp_disk", "fsdp_async"):
        assert sorted(p.name for p in (out / name / "work" / "checkpoints").glob("*.dcp")) == [
            "iter_12.dcp",
            "iter_16.dcp",
            "iter_4.dcp",
            "iter_8.dcp",
        ]
    _assert_close(ddp[0]["params"], _reference(skipped_batches=(4, 5)))


def test_a_spike_ending_an_accumulation_window_skips_the_window_under_fsdp_as_under_ddp(out: Path) -> None:
    """accumulative_counts=2: the spike at iteration 6 is the micro-batch that ends window 5-6 (the one that would
    reduce the window's
    gradients). The window is not stepped and its first micro-batch's gradients do not leak into the next window: FSDP
    equals DDP
    bitwise, and one process stepping on 16 samples at a time, that window left out."""
    ddp, fsdp = _results(out, "ddp_accum")[0], _results(out, "fsdp_accum")[0]
    assert (ddp["skipped"], fsdp["skipped"]) == (2, 2)
    assert fsdp["params"].keys() == ddp["params"].keys()
    for k, v in ddp["params"].items():
        assert torch.equal(fsdp["params"][k], v), k
    _assert_close(ddp["params"], _reference(skipped_batches=(2,), per_step=2))
