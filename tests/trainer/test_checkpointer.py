"""The Trainer's checkpoint API lives in its Checkpointer; the Trainer's public methods stay the override points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.checkpoint import read_latest


class RecordingTrainer(tw.Trainer):
    """Records the calls of the public checkpoint methods that the checkpoint API makes itself."""

    def __init__(self, **kwargs: Any) -> None:
        self.calls: list[str] = []
        super().__init__(**kwargs)

    def state_dict(self, save_optimizer: bool = True, save_param_scheduler: bool = True) -> dict[str, Any]:  # noqa: D102
        self.calls.append("state_dict")
        return super().state_dict(save_optimizer, save_param_scheduler)

    def save_checkpoint(self, path: str | Path, *args: Any, **kwargs: Any) -> Path:  # noqa: D102
        self.calls.append("save_checkpoint")
        return super().save_checkpoint(path, *args, **kwargs)

    def load_weights(self, path: str | Path, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        self.calls.append("load_weights")
        return super().load_weights(path, *args, **kwargs)


def _trainer(work_dir: Path, **kwargs: Any) -> RecordingTrainer:
    return RecordingTrainer(
        model=LinearReg(), work_dir=work_dir, train_dataloader=DataLoader(regression_set(), batch_size=2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05)), train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=None), log_level="WARNING", randomness=dict(seed=0), **kwargs,
    )


def test_a_subclass_overriding_the_checkpoint_methods_sees_the_calls_the_checkpoint_api_makes(tmp_path: Path) -> None:
    with _trainer(tmp_path / "a") as t:
        assert not t.prepared
        t.train()
        assert t.prepared
        t.calls.clear()
        path = t.request_checkpoint()  # no checkpoint hook: the trainer serves, through save_checkpoint and state_dict
        assert path == tmp_path / "a" / "checkpoints" / "iter_10.pth" and read_latest(path.parent) == "iter_10.pth"
        assert t.calls == ["save_checkpoint", "state_dict"]
        assert list(t.stateful) == list(t.checkpointer.stateful)
    assert not t.prepared

    with _trainer(tmp_path / "b", load_from=path) as t2:
        t2.train()
        assert t2.calls[0] == "load_weights"
