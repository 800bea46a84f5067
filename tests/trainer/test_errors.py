"""The errors users hit first: each names the problem and the fix, before any training step runs."""

from __future__ import annotations

import pytest
import torch
from conftest import LinearReg, regression_set
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Counting(LinearReg):
    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def train_step(self, data, optim_wrapper):
        self.steps += 1
        return super().train_step(data, optim_wrapper)


def _assert_fails_before_training(factory, exc, match, **kwargs):
    model = Counting()
    with pytest.raises(exc, match=match):
        factory(model=model, **kwargs).train()
    assert model.steps == 0


def test_unknown_optimizer_type_suggests(trainer_factory):
    _assert_fails_before_training(
        trainer_factory,
        KeyError,
        "Unknown optimizer type 'SDG'. Did you mean 'SGD'",
        optim_wrapper=dict(optimizer=dict(type="SDG", lr=0.1)),
    )


def test_unknown_scheduler_type_suggests(trainer_factory):
    _assert_fails_before_training(
        trainer_factory,
        KeyError,
        "Did you mean 'CosineAnnealingLR'",
        param_scheduler=[dict(type="CosineAnealingLR", by_epoch=True, begin=0, end=2)],
    )


@pytest.mark.parametrize(
    ("train_cfg", "needed"),
    [
        (dict(by_epoch=True), "max_epochs"),
        (dict(), "max_epochs"),
        (dict(by_epoch=False), "max_iters"),
        (dict(by_epoch=False, max_epochs=2), "max_iters"),
    ],
)
def test_missing_train_length(trainer_factory, train_cfg, needed):
    _assert_fails_before_training(
        trainer_factory, KeyError, f"needs {needed}, e.g. train_cfg=dict\\(", train_cfg=train_cfg
    )


def test_unknown_train_cfg_key_suggests(trainer_factory):
    with pytest.raises(KeyError, match="Unknown train_cfg key 'max_epoch'. Did you mean 'max_epochs'"):
        trainer_factory(train_cfg=dict(max_epoch=3))


def test_model_returning_no_loss_in_loss_mode(trainer_factory):
    class NoLoss(Counting):
        def forward(self, x, y=None, mode="tensor"):
            out = self.linear(x)
            return {"mse": ((out - y) ** 2).mean()} if mode == "loss" else out

    model = NoLoss()
    with pytest.raises(ValueError, match="returned no loss.*Name the loss entries"):
        trainer_factory(model=model).train()
    assert all(p.grad is None for p in model.parameters())


def test_plain_module_returning_non_loss(trainer_factory):
    class Tuple(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 1)

        def forward(self, x, y):
            return self.linear(x), y

    with pytest.raises(
        TypeError,
        match="must return a loss tensor, a dict of losses or an output with a `loss` attribute.*subclass "
        "trainwright.BaseModel.*tuple is not read by position.*dict\\(loss=...\\)",
    ):
        trainer_factory(model=Tuple()).train()


@pytest.mark.parametrize(
    "loader_kwargs",
    [
        dict(dataset=TensorDataset(torch.zeros(0, 4), torch.zeros(0, 1)), batch_size=2),
        dict(dataset=regression_set(3), batch_size=4, drop_last=True),
    ],
)
def test_empty_train_loader(trainer_factory, loader_kwargs):
    _assert_fails_before_training(
        trainer_factory,
        ValueError,
        "train_dataloader is empty.*batch_size <= len\\(dataset\\)",
        train_dataloader=DataLoader(**loader_kwargs),
    )


@pytest.mark.parametrize("acc", [0, -2])
def test_accumulative_counts_below_one(trainer_factory, acc):
    _assert_fails_before_training(
        trainer_factory,
        ValueError,
        "accumulative_counts must be an int >= 1 \\(1 = no accumulation\\)",
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1), accumulative_counts=acc),
    )


def test_wrong_clip_grad_keys(trainer_factory):
    _assert_fails_before_training(
        trainer_factory,
        ValueError,
        "Unknown clip_grad key 'max_nrom'.*Did you mean 'max_norm'",
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1), clip_grad=dict(max_nrom=1.0)),
    )


def test_unknown_default_hook_name(trainer_factory):
    with pytest.raises(KeyError, match="Unknown default hook 'chekpoint'. Did you mean 'checkpoint'"):
        trainer_factory(default_hooks=dict(chekpoint=dict(interval=2)))


def test_train_without_optim_wrapper(trainer_factory):
    _assert_fails_before_training(
        trainer_factory, ValueError, "needs an optim_wrapper, e.g. optim_wrapper=dict", optim_wrapper=None
    )


def test_val_without_loader(trainer_factory):
    with pytest.raises(ValueError, match="val\\(\\) needs a val_dataloader"):
        trainer_factory().val()


def test_unknown_nonfinite_loss_option(trainer_factory):
    with pytest.raises(ValueError, match="'raise' or 'skip'"):
        trainer_factory(nonfinite_loss="ignore")


def test_unknown_precision_suggests(trainer_factory):
    with pytest.raises(ValueError, match="Did you mean 'bf16-mixed'"):
        trainer_factory(precision="bf16_mixed")


def test_eval_dataloader_dict_is_checked_and_built(tmp_path) -> None:
    """val/test loaders given as dicts are validated like the train loader (unknown keys named, datasets by type)."""
    import torch
    from torch.utils.data import TensorDataset

    import trainwright as tw
    from trainwright.registry import DATASETS

    @DATASETS.register(name="TinyRegressionForEvalTest", force=True)
    def tiny() -> TensorDataset:  # a registered dataset factory
        return TensorDataset(torch.randn(8, 4), torch.randn(8, 1))

    trainer = tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        val_dataloader=dict(dataset=dict(type="TinyRegressionForEvalTest"), batch_size=4),
    )
    assert len(trainer.val_loop.dataloader.dataset) == 8
    trainer.close()
    with pytest.raises(KeyError, match="batch_size"):
        tw.Trainer(model=LinearReg(), work_dir=tmp_path, val_dataloader=dict(dataset=tiny(), batchsize=4))


@pytest.mark.parametrize(
    ("clip_grad", "match"),
    [
        (
            dict(max_norm=-1.0),
            r"max_norm=-1.0 must be a number > 0 \(a negative max_norm turns clipping into gradient ascent\)",
        ),
        (dict(max_norm=1.0, norm_type=0), "norm_type=0 must be a number > 0"),
        (dict(type="value", clip_value=-0.5), "clip_value=-0.5 must be a number > 0"),
        (dict(max_norm="1"), "max_norm='1' must be a number > 0"),
    ],
)
def test_clip_grad_values_are_checked_not_just_keys(trainer_factory, clip_grad, match):
    """A negative max_norm used to be accepted and turned training into gradient ascent."""
    _assert_fails_before_training(
        trainer_factory, ValueError, match, optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1), clip_grad=clip_grad)
    )


def test_max_epochs_and_max_iters_together_are_refused(trainer_factory):
    """Both given used to run max_iters and drop max_epochs without a word."""
    _assert_fails_before_training(
        trainer_factory,
        ValueError,
        "both max_epochs=10 and max_iters=5: give one",
        train_cfg=dict(max_epochs=10, max_iters=5),
    )


def test_an_optimizer_over_another_models_parameters_is_refused(trainer_factory):
    """An optimizer built over a different model object trains nothing of the trainer's model."""
    other = LinearReg()
    _assert_fails_before_training(
        trainer_factory,
        ValueError,
        r"holds 2 of its 2 parameters that are not the model's",
        optim_wrapper=torch.optim.SGD(other.parameters(), lr=0.1),
    )


def test_type_suggestions_ignore_case(trainer_factory):
    _assert_fails_before_training(
        trainer_factory,
        KeyError,
        "Unknown optimizer type 'Adamw'. Did you mean 'AdamW'",
        optim_wrapper=dict(optimizer=dict(type="Adamw", lr=0.1)),
    )


def test_the_reason_a_run_stopped_reaches_train_log(trainer_factory):
    class Boom(LinearReg):
        def train_step(self, data, optim_wrapper):
            raise RuntimeError("the data loader lost its disk")

    t = trainer_factory(model=Boom())
    with pytest.raises(RuntimeError, match="lost its disk"):
        t.train()
    t.close()
    log = (t.run_dir / "train.log").read_text()
    assert (
        "Stopped by RuntimeError at epoch 1, iteration 0: the data loader lost its disk" in log
    )  # epochs numbered from 1, as the log lines


def test_trainer_is_a_context_manager_that_closes_its_files(tmp_path):
    import trainwright as tw

    with tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(regression_set(8), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
    ) as t:
        t.train()
        handlers = list(t.logger.handlers)
    assert all(getattr(h, "stream", None) is None or h.stream.closed for h in handlers if hasattr(h, "baseFilename"))
    assert not t.logger.handlers or all(not hasattr(h, "baseFilename") for h in t.logger.handlers)


def test_an_epoch_scheduler_in_an_iteration_run_is_named(trainer_factory):
    """It would never step (the lr stayed constant for the whole run, silently)."""
    with pytest.warns(UserWarning, match=r"\['CosineAnnealingLR'\].*convert_to_iter_based=True"):
        trainer_factory(
            train_cfg=dict(by_epoch=False, max_iters=4),
            param_scheduler=dict(type="CosineAnnealingLR", by_epoch=True, begin=0, end=2),
        ).train()


def test_val_without_an_evaluator_says_why_there_are_no_metrics(trainer_factory):
    t = trainer_factory(val_dataloader=DataLoader(regression_set(8), batch_size=4))
    with pytest.warns(UserWarning, match="without a val_evaluator.*val_evaluator=tw.evaluation.Accuracy"):
        assert t.val() == {}


def test_training_again_past_the_end_says_there_is_nothing_to_train(trainer_factory):
    t = trainer_factory(train_cfg=dict(by_epoch=True, max_epochs=1))
    t.train()
    t.train()
    t.flush_logs()
    assert "Nothing to train: training is complete at iteration" in (t.run_dir / "train.log").read_text()


def test_a_failing_after_run_skips_no_other_cleanup_and_hides_no_error(trainer_factory):
    """One hook's after_run raising used to skip the others (SIGTERM handler left installed) and hide the training
    error."""
    import signal

    import trainwright as tw

    class BadCleanup(tw.Hook):
        priority = "HIGHEST"

        def after_run(self, trainer):
            raise OSError("disk gone while closing")

    class Boom(LinearReg):
        def train_step(self, data, optim_wrapper):
            raise RuntimeError("the real error")

    before = signal.getsignal(signal.SIGTERM)
    t = trainer_factory(model=Boom(), custom_hooks=[BadCleanup()])
    with pytest.raises(RuntimeError, match="the real error"):  # the original error, not the cleanup's
        t.train()
    assert signal.getsignal(signal.SIGTERM) == before  # the preemption hook's cleanup still ran
    t.flush_logs()
    assert (
        "BadCleanup.after_run failed while the run was cleaning up: OSError: disk gone while closing"
        in (t.run_dir / "train.log").read_text()
    )
    # a run that succeeded reports its cleanup error
    t2 = trainer_factory(custom_hooks=[BadCleanup()], work_dir=t.run_dir.parent / "second")
    with pytest.raises(OSError, match="disk gone"):
        t2.train()
    assert signal.getsignal(signal.SIGTERM) == before
