"""Members that moved off the Trainer keep their old names, with a DeprecationWarning naming where they live now."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from conftest import LinearReg, regression_set

import trainwright as tw
from trainwright.runner import Runner


def test_old_names_answer_with_a_warning_naming_the_new_place(tmp_path: Path) -> None:
    with tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=dict(dataset=regression_set(), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=3),
        randomness=dict(seed=7),
        nonfinite_loss="skip",
        experiment_name="run1",
        default_hooks=dict(checkpoint=None),
        log_level="WARNING",
    ) as t:
        expected = {
            "ckpt_dir": ("trainer.checkpoints.ckpt_dir", tmp_path / "checkpoints"),
            "seed": ("trainer.strategy.seed", 7),
            "is_main_process": ("trainer.strategy.is_main_process", True),
            "work_dir": ("trainer.config['work_dir']", tmp_path),
            "experiment_name": ("trainer.run_dir.name", "run1"),
            "train_cfg": ("trainer.config['train_cfg']", {"by_epoch": False, "max_iters": 3}),
            "nonfinite_loss": ("trainer.config['nonfinite_loss']", "skip"),
            "max_iters": ("trainer.train_loop.max_iters", 0),  # no train loop yet
        }
        for name, (new, value) in expected.items():
            with pytest.warns(
                DeprecationWarning, match=rf"trainer\.{name} moved to {new.replace('[', '.').replace(']', '.')}"
            ):
                assert getattr(t, name) == value, name
        t.train()
        with pytest.warns(
            DeprecationWarning, match=r"trainer\.request_checkpoint moved to trainer\.checkpoints\.save_now"
        ):
            assert t.request_checkpoint() == tmp_path / "checkpoints" / "iter_3.pth"
        with pytest.warns(DeprecationWarning, match=r"trainer\.hook_report moved to trainer\.hooks\.report"):
            assert [tuple(r) for r in t.hook_report()] == [tuple(r) for r in t.hooks.report()]
        with pytest.raises(AttributeError, match=r"'Trainer' object has no attribute 'no_such_member'"):
            t.no_such_member  # noqa: B018 - the lookup is the test
        assert not hasattr(t, "adopt_seed")


def test_the_runner_keeps_mmengines_attributes_without_a_warning(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        runner = Runner(
            model=LinearReg(),
            work_dir=str(tmp_path),
            train_dataloader=dict(dataset=regression_set(), batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
            train_cfg=dict(by_epoch=False, max_iters=3),
            randomness=dict(seed=5),
            experiment_name="exp",
            log_level="WARNING",
        )
        try:
            assert (runner.seed, runner.max_iters, runner.work_dir, runner.experiment_name) == (5, 3, tmp_path, "exp")
            assert torch.initial_seed() == 5
        finally:
            runner.close()


def test_should_stop_set_by_a_hook_still_stops_through_the_run_control(tmp_path: Path) -> None:
    """Lightning's / mmengine users' ``trainer.should_stop = True``: deprecated, mapped onto the loop's run control."""

    class StopAt3(tw.Hook):
        def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None) -> None:  # noqa: ANN001
            if trainer.progress.iteration == 3:
                trainer.should_stop = True

    with tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=dict(dataset=regression_set(), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=10),
        default_hooks=dict(checkpoint=None),
        custom_hooks=[StopAt3()],
        log_level="WARNING",
    ) as t:
        with pytest.warns(DeprecationWarning, match=r"should_stop = True is deprecated.*control\.request_stop"):
            t.train()
        assert t.progress.iteration == 3 and t.should_stop
        assert t.train_loop is not None and t.train_loop.control.stop_reason == "trainer.should_stop = True"
        with pytest.warns(DeprecationWarning, match=r"trainer\.preempted moved to trainer\.train_loop\.control"):
            assert t.preempted is False
        for name, new, value in (
            ("agreement", r"trainer\.metric_store\.agreement", t.metric_store.agreement),
            ("writers", r"trainer\.log_lines\.writers", t.log_lines.writers),
            ("spike_guard", r"trainer\.hooks", None),  # no spike_guard= given
        ):
            with pytest.warns(DeprecationWarning, match=rf"trainer\.{name} moved to {new}"):
                assert getattr(t, name) is value, name
