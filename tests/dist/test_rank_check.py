"""What the start-of-run comparison of the ranks reports (no process group: descriptions built by hand).

The 2-process runs that raise it are in test_rank_faults.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import LinearReg, regression_set
import trainwright as tw
from trainwright.trainer.rank_check import check_ranks_agree, describe_rank, disagreements


def _rank(lr: float = 0.1, batches: int = 4, batch_size: int = 8, resumed: tuple[str, int] | None = None, **extra: str) -> dict[str, Any]:
    settings = {"optim_wrapper.optimizer.lr": repr(lr), **extra}
    return {"hash": str(sorted(settings.items())), "settings": settings, "batches per epoch": batches, "batch_size": batch_size, "resumed": resumed}


def test_ranks_that_agree_report_nothing() -> None:
    assert disagreements([_rank(), _rank()]) == []


def test_each_difference_is_named_with_every_rank_value() -> None:
    found = disagreements([
        _rank(resumed=("/a/work/checkpoints/iter_20.pth", 20)),
        _rank(lr=0.2, batches=8, batch_size=4),
    ])
    assert found == [
        "rank 0 from /a/work/checkpoints/iter_20.pth (iteration 20); rank 1 resumed from nothing",
        "train_dataloader batches per epoch differs: rank 0 4, rank 1 8",
        "train_dataloader batch_size differs: rank 0 8, rank 1 4",
        "optim_wrapper.optimizer.lr differs: rank 0 0.1, rank 1 0.2",
    ]


def test_the_same_checkpoint_in_other_work_dirs_agrees_and_a_setting_one_rank_lacks_is_named() -> None:
    same = [_rank(resumed=("/node0/work/checkpoints/iter_8.pth", 8)), _rank(resumed=("/node1/work/checkpoints/iter_8.pth", 8))]
    assert disagreements(same) == []
    assert disagreements([_rank(), _rank(**{"train_cfg.max_iters": "10"})]) == ["train_cfg.max_iters differs: rank 0 <not set>, rank 1 10"]


def test_a_description_leaves_out_what_may_differ_per_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """work_dir, the run's name, the seed, custom hooks and objects shown by address are not compared; one process
    checks nothing."""
    # one process, whatever an earlier test left
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    t = tw.Trainer(
        model=LinearReg(), work_dir=tmp_path, train_dataloader=dict(dataset=regression_set(), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)), train_cfg=dict(by_epoch=False, max_iters=2),
        randomness=dict(seed=3, deterministic=False), custom_hooks=[tw.Hook()], log_level="WARNING",
    )
    try:
        loop = t.build_train_loop()
        d = describe_rank(t.config, loop.dataloader, t.checkpoints.restored)
        assert d["batches per epoch"] == 5 and d["batch_size"] == 4 and d["resumed"] is None
        assert d["settings"]["optim_wrapper.optimizer.lr"] == "0.1" and d["settings"]["randomness.deterministic"] == "False"
        for key in ("work_dir", "experiment_name", "seed", "randomness.seed", "custom_hooks"):
            assert key not in d["settings"], key
        assert not any(" at 0x" in v for v in d["settings"].values())
        # one process: no collective, nothing to compare
        check_ranks_agree(t.strategy, t.config, loop.dataloader, t.checkpoints.restored)
    finally:
        t.close()


def test_many_differences_are_listed_up_to_a_dozen() -> None:
    a = _rank(**{f"k{i:02d}": "1" for i in range(13)})
    b = _rank(**{f"k{i:02d}": "2" for i in range(13)})
    found = disagreements([a, b])
    assert len(found) == 13 and found[-1] == "and 1 more settings (k12)"
