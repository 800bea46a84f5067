"""The Trainer's checkpoint methods are aliases of its CheckpointManager (``trainer.checkpoints``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.checkpoint import load_file, read_latest


def _trainer(work_dir: Path, **kwargs: Any) -> tw.Trainer:
    return tw.Trainer(
        model=LinearReg(),
        work_dir=work_dir,
        train_dataloader=DataLoader(regression_set(), batch_size=2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=None),
        randomness=dict(seed=0),
        **{"log_level": "WARNING", **kwargs},
    )


def test_the_trainer_checkpoint_methods_go_to_its_manager(tmp_path: Path) -> None:
    with _trainer(tmp_path / "a") as t:
        assert not t.prepared
        t.train()
        assert t.prepared
        path = t.request_checkpoint()  # no checkpoint hook: the manager names as the loop counts (an epoch's end)
        assert path == tmp_path / "a" / "checkpoints" / "epoch_1.pth" and read_latest(path.parent) == "epoch_1.pth"
        assert t.request_checkpoint() is None  # this iteration is saved already
        assert (
            list(t.stateful)
            == list(t.checkpoints.stateful)
            == [
                "meta",
                "model",
                "optim_wrapper",
                "progress",
                "train_dataloader",
                "data_state",
                "metric_store",
                "message_hub",
                "hooks",
                "rng",
            ]
        )
        assert list(t.state_dict(save_optimizer=False)) == [
            "meta",
            "model",
            "progress",
            "train_dataloader",
            "data_state",
            "metric_store",
            "message_hub",
            "hooks",
            "rng",
        ]
        other = t.save_checkpoint("other.pth", save_optimizer=False)
        assert other == path.parent / "other.pth" and "optim_wrapper" not in load_file(other)
        assert read_latest(path.parent) == "epoch_1.pth"  # an explicit save does not move latest
    assert not t.prepared

    with _trainer(tmp_path / "b", load_from=path, log_level="INFO") as t2:
        t2.train()
    assert f"Loaded weights from {path}" in next((tmp_path / "b").glob("*/train.log")).read_text()
