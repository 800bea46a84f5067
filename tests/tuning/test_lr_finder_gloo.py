"""find_lr under 2 gloo processes (DDP and FSDP): every rank sees the same curve, and training after it equals training
without, bitwise.

One torchrun start runs both strategies (lr_rank_train.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from launch import launch

SCRIPT = Path(__file__).with_name("lr_rank_train.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("lr")
    launch(SCRIPT, [str(tmp / "out"), "ddp", "fsdp"], tmp, nproc=2, timeout=240)
    return tmp / "out"


def _results(out: Path, strategy: str) -> list[dict]:
    return [torch.load(out / strategy / f"rank{r}.pt") for r in range(2)]


def _assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in b), [k for k in b if not torch.equal(a[k], b[k])]


def test_find_lr_under_ddp_leaves_both_ranks_unchanged(out: Path) -> None:
    r0, r1 = _results(out, "ddp")
    assert (
        r0["lrs"] == r1["lrs"] and r0["losses"] == r1["losses"] and r0["suggestion"] == r1["suggestion"]
    )  # losses averaged over ranks
    assert 2 <= len(r0["lrs"]) <= 12
    for r in (r0, r1):
        _assert_equal(r["tuned"], r["plain"])  # weights, dropout masks, data order: as without
    _assert_equal(r0["tuned"], r1["tuned"])


def test_find_lr_under_fsdp_puts_the_sharded_trainer_back(out: Path) -> None:
    """Sharded parameters and optimizer state captured and restored: train() after find_lr equals train() without,
    bitwise
    (the full weights, gathered from both ranks' shards); the curve is the same on both ranks and the same as DDP's."""
    r0, r1 = _results(out, "fsdp")
    ddp = _results(out, "ddp")[0]
    assert r0["lrs"] == r1["lrs"] == ddp["lrs"] and r0["losses"] == r1["losses"] == ddp["losses"]
    assert r0["tuned"].keys() == {
        "net.0.weight",
        "net.0.bias",
        "net.3.weight",
        "net.3.bias",
    }  # rank 0 holds the gathered weights
    _assert_equal(r0["tuned"], r0["plain"])
    _assert_equal(r0["plain"], ddp["plain"])  # and FSDP trained as DDP did (measured: bitwise on this model)
