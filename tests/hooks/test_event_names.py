"""A hook method named like an event it is not (detectron2's ``before_step``, a near-miss) is named in a warning at
registration."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from conftest import LinearReg, regression_set

import trainwright as tw


def _trainer(tmp_path: Path, hook: tw.Hook) -> tw.Trainer:
    return tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=dict(dataset=regression_set(), batch_size=8),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=None),
        custom_hooks=[hook],
        log_level="WARNING",
    )


def test_a_ported_detectron2_hook_is_named_with_the_events_to_write(tmp_path: Path) -> None:
    class PortedHook(tw.Hook):
        def before_step(self) -> None:
            self.calls = getattr(self, "calls", 0) + 1

        def after_step(self) -> None:
            pass

        def after_backward(self) -> None:
            pass

    with pytest.warns(UserWarning) as caught:
        trainer = _trainer(tmp_path, PortedHook())
    (message,) = [str(w.message) for w in caught if "PortedHook" in str(w.message)]
    assert (
        "PortedHook.before_step: detectron2's HookBase event; trainwright never calls it: write "
        "before_train_iter(self, trainer, batch_idx, data_batch)" in message
    )
    assert (
        "PortedHook.after_step: detectron2's HookBase event; trainwright never calls it: write after_train_iter("
        in message
    )
    assert (
        "PortedHook.after_backward: detectron2's HookBase event; trainwright never calls it: write "
        "optimizer.register_step_pre_hook(fn)" in message
    )
    assert message.endswith(
        "A detectron2 hook runs as it is under trainwright.engine.SimpleTrainer, subclassing "
        "trainwright.engine.HookBase"
    )
    trainer.close()


def test_a_near_miss_of_an_event_is_named_and_helpers_are_not(tmp_path: Path) -> None:
    class Typo(tw.Hook):
        def after_train_iteration(self, trainer, batch_idx, data_batch=None, outputs=None) -> None:
            pass

    class Fine(tw.Hook):
        def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None) -> None:
            self.seen = True

        def summarise(self) -> None:  # a helper: no event resembles it
            pass

    with pytest.warns(
        UserWarning,
        match=r"Typo.after_train_iteration: not an event, so never called; did you mean 'after_train_iter'\?",
    ):
        _trainer(tmp_path / "a", Typo()).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fine = Fine()
        trainer = _trainer(tmp_path / "b", fine)
        trainer.train()
    assert fine.seen
    trainer.close()
