"""mmengine's message hub: the run's facts read live by hooks and models, logged scalars, hook-written info resumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.logging import MessageHub


class Net(tw.BaseModel):
    """Reads the iteration from the current message hub in its forward, as mmdet losses do for warm-ups."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.seen_iters: list[int] = []

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        if mode == "loss":
            self.seen_iters.append(MessageHub.get_current_instance().get_info("iter"))
            return {"loss": F.cross_entropy(self.fc(x), y)}
        return self.fc(x)


class Watch(tw.Hook):
    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int]] = []

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        hub = trainer.message_hub
        self.rows.append(
            (hub.get_info("epoch"), hub.get_info("iter"), hub.get_info("max_epochs"), hub.get_info("max_iters"))
        )

    def after_train_epoch(self, trainer: Any) -> None:
        trainer.message_hub.update_info("epochs_seen", trainer.message_hub.get_info("epochs_seen", 0) + 1)
        trainer.message_hub.update_info("scratch", "not saved", resumed=False)


def _trainer(work_dir: Path, max_epochs: int, **kw: Any) -> tw.Trainer:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(24, 4, generator=g), torch.randint(0, 3, (24,), generator=g))
    return tw.Trainer(
        Net(),
        work_dir=work_dir,
        train_dataloader=DataLoader(data, batch_size=8),
        val_dataloader=DataLoader(data, batch_size=8),
        val_evaluator=dict(type="Accuracy"),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        log_level="WARNING",
        **kw,
    )


def test_hooks_and_models_read_the_run_live(tmp_path: Path) -> None:
    watch = Watch()
    t = _trainer(tmp_path, 2, custom_hooks=[watch])
    t.train()
    model = t.unwrapped_model
    # as mmengine's RuntimeInfoHook sets it before each iteration: completed iterations (0 in the first forward)
    assert model.seen_iters == list(range(6))
    assert watch.rows == [(0, 1, 2, 6), (0, 2, 2, 6), (0, 3, 2, 6), (1, 4, 2, 6), (1, 5, 2, 6), (1, 6, 2, 6)]
    hub = t.message_hub
    assert MessageHub.get_current_instance() is hub and MessageHub.get_instance(t.run_dir.name) is hub
    assert hub.get_scalar("train/loss").current() == t.metric_store.get("loss").latest
    assert (
        hub.get_scalar("val/acc").current() == t.val()["val/acc"]
    )  # written by the RuntimeInfoHook after each evaluation
    t.close()


def test_hook_written_info_is_resumed_and_the_runs_facts_cannot_be_set(tmp_path: Path) -> None:
    t = _trainer(tmp_path, 2, custom_hooks=[Watch()])
    t.train()
    assert t.message_hub.get_info("epochs_seen") == 2
    with pytest.raises(KeyError, match="'iter' is the run's own"):
        t.message_hub.update_info("iter", 5)
    with pytest.raises(KeyError, match="no scalar 'train/nope'"):
        t.message_hub.get_scalar("train/nope")
    t.close()
    resumed = _trainer(tmp_path, 3, resume=True)
    resumed.train()
    assert resumed.message_hub.get_info("epochs_seen") == 2  # restored (this run has no Watch hook to count on)
    assert resumed.message_hub.get_info("scratch") is None  # written with resumed=False: not saved
    assert (
        resumed.message_hub.get_scalar("val/acc").count == 3
    )  # epochs 1 and 2 from the checkpoint, epoch 3 from this run
    resumed.close()


def test_the_hub_does_not_keep_a_closed_trainer_alive(tmp_path: Path) -> None:
    """The class-level registry holds hubs weakly: a closed trainer (its model, a DDP wrapper, its process group) can
    be freed."""
    import gc
    import weakref

    t = _trainer(tmp_path, 1)
    t.train()
    t.close()
    gone = weakref.ref(t)
    del t
    gc.collect()
    assert gone() is None


class WritesScalars(tw.Hook):
    """Writes a ``train/`` scalar at every iteration (as mmengine hooks do) and a non-train one that is not logged."""

    # before the logger hook at the same iteration, as mmengine's LoggerHook (BELOW_NORMAL) runs after such hooks
    priority = "HIGH"

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        trainer.message_hub.update_scalar("train/aux", float(trainer.progress.iteration))
        trainer.message_hub.update_scalar("other/ignored", 1.0)


def test_train_scalars_written_to_the_hub_are_logged_as_the_mean_since_the_previous_line(tmp_path: Path) -> None:
    from conftest import train_records

    t = _trainer(
        tmp_path, 2, custom_hooks=[WritesScalars()], default_hooks=dict(logger=dict(interval=2), checkpoint=None)
    )
    t.train()
    records = train_records(t.run_dir)
    # lines at iterations 2, 3 (epoch end), 5, 6: the values written since the previous line, averaged
    assert [(r["iter"], r["aux"]) for r in records] == [(2, 1.5), (3, 3.0), (5, 4.5), (6, 6.0)]
    assert all("ignored" not in r and "other/ignored" not in r for r in records)
    t.close()
