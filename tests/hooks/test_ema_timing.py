"""EMAHook in a real run, against mmengine's timing: the iteration of the first update, the average before it,
strict_load."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import regression_set  # 20 samples, batch 4: 5 iterations per epoch

import trainwright as tw
from trainwright.hooks.ema import EMAHook


class Probe(tw.Hook):
    """After each iteration (after the EMA hook): the update count, the saved average and the model's weights."""

    priority = "LOW"

    def __init__(self, hook: EMAHook) -> None:
        self.hook = hook
        self.steps: dict[int, int] = {}
        self.same_as_model: dict[int, bool] = {}

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        it = trainer.progress.iteration
        self.steps[it] = self.hook.ema.steps
        averaged = self.hook.state_dict()["averaged"]
        self.same_as_model[it] = all(
            torch.equal(averaged[k], v) for k, v in trainer.unwrapped_model.state_dict().items()
        )


def _run(trainer_factory: Any, hook: EMAHook, **kw: Any) -> tuple[Any, Probe]:
    probe = Probe(hook)
    kw.setdefault("train_cfg", dict(by_epoch=True, max_epochs=3))
    t = trainer_factory(dataset=regression_set(20), batch_size=4, custom_hooks=[hook, probe], **kw)
    t.train()
    return t, probe


@pytest.mark.parametrize(
    ("begin", "first"),
    [
        (dict(begin_iter=5), 5),
        (dict(begin_iter=1), 1),
        (dict(begin_iter=0), 1),
        (dict(begin_epoch=2), 6),
        (dict(begin_epoch=3), 11),
        (dict(begin_epoch=1), 1),
    ],
)
def test_first_update_at_mmengines_iteration(trainer_factory: Any, begin: dict[str, int], first: int) -> None:
    """mmengine updates while runner.iter + 1 >= begin_iter / runner.epoch + 1 >= begin_epoch (0-based counters in
    after_train_iter)."""
    hook = EMAHook(momentum=0.5, **begin)
    _, probe = _run(trainer_factory, hook)
    assert [it for it, n in probe.steps.items() if n == 1] == [first]  # the first update is made at that iteration
    assert probe.steps[15] == 15 - first + 1


def test_first_update_in_an_iteration_based_run(trainer_factory: Any) -> None:
    hook = EMAHook(momentum=0.5, begin_epoch=2)  # an epoch is a pass over the 5 batches
    _, probe = _run(trainer_factory, hook, train_cfg=dict(by_epoch=False, max_iters=12))
    assert min(it for it, n in probe.steps.items() if n > 0) == 6


def test_before_the_first_update_the_average_is_the_live_model(trainer_factory: Any, tmp_path: Path) -> None:
    hook = EMAHook(momentum=0.5, begin_iter=8)
    torch.manual_seed(0)
    t, probe = _run(trainer_factory, hook, default_hooks=dict(checkpoint=dict(interval=3, by_epoch=False)))
    assert all(probe.same_as_model[it] for it in range(1, 8))
    assert probe.same_as_model[8]  # the first update copies the weights
    assert not any(probe.same_as_model[it] for it in range(9, 16))  # then it averages
    # A checkpoint written before averaging began exports the trained weights, not the initial ones.
    ckpt = torch.load(tmp_path / "checkpoints" / "iter_6.pth", weights_only=True)
    averaged = ckpt["hooks"]["EMAHook"]["averaged"]
    assert all(torch.equal(averaged[k], v) for k, v in ckpt["model"].items())
    model = type(t.unwrapped_model)()
    model.load_state_dict(averaged)
    assert not torch.equal(
        model.linear.weight, type(t.unwrapped_model)().linear.weight
    )  # trained, not the initial weights


@pytest.mark.parametrize(
    ("begin", "match"),
    [
        (
            dict(begin_iter=16),
            "begin_iter=16 starts averaging at iteration 16, but the run ends at iteration 15 \\(3 epochs of 5",
        ),
        (dict(begin_epoch=4), "begin_epoch=4 starts averaging at iteration 16"),
    ],
)
def test_begin_past_the_end_of_the_run_is_refused_at_start(
    trainer_factory: Any, begin: dict[str, int], match: str
) -> None:
    t = trainer_factory(
        dataset=regression_set(20),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=3),
        custom_hooks=[EMAHook(**begin)],
    )
    with pytest.raises(ValueError, match=match):
        t.train()
    assert t.progress.iteration == 0


def test_begin_at_the_last_iteration_is_accepted(trainer_factory: Any) -> None:
    hook = EMAHook(begin_iter=15)
    _, probe = _run(trainer_factory, hook)
    assert probe.steps[15] == 1


def test_begin_iter_and_begin_epoch_together_are_refused() -> None:
    with pytest.raises(ValueError, match="set one of them"):
        EMAHook(begin_iter=3, begin_epoch=2)


def _checkpoint_with_edited_average(trainer_factory: Any, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A run with the EMA hook writes epoch_1.pth; its saved average gets an unexpected key and a bias of another
    shape."""
    first = trainer_factory(
        dataset=regression_set(20),
        batch_size=4,
        custom_hooks=[EMAHook(momentum=0.5)],
        default_hooks=dict(checkpoint=dict(interval=1)),
    )
    first.train()
    path = tmp_path / "checkpoints" / "epoch_1.pth"
    ckpt = torch.load(path, weights_only=True)
    averaged = ckpt["hooks"]["EMAHook"]["averaged"]
    averaged["extra"] = torch.zeros(2)
    averaged["linear.bias"] = torch.zeros(3)
    torch.save(ckpt, path)
    return path, ckpt


def test_strict_load_false_loads_what_matches_and_warns(trainer_factory: Any, tmp_path: Path) -> None:
    path, ckpt = _checkpoint_with_edited_average(trainer_factory, tmp_path)
    hook = EMAHook(momentum=0.5, strict_load=False)
    t = trainer_factory(dataset=regression_set(20), batch_size=4, custom_hooks=[hook], resume=path)
    with pytest.warns(UserWarning, match=r"unexpected keys \['extra'\].*linear.bias: saved \(3,\), model \(1,\)"):
        t.train()  # complete already: builds and loads the average, trains nothing
    saved = ckpt["hooks"]["EMAHook"]
    assert hook.ema.steps == saved["steps"] == 5
    assert torch.equal(hook.ema.averaged["linear.weight"], saved["averaged"]["linear.weight"])
    assert torch.equal(
        hook.ema.averaged["linear.bias"], ckpt["model"]["linear.bias"]
    )  # the mismatched entry starts from the model


def test_strict_load_true_names_the_mismatch(trainer_factory: Any, tmp_path: Path) -> None:
    path, _ = _checkpoint_with_edited_average(trainer_factory, tmp_path)
    t = trainer_factory(dataset=regression_set(20), batch_size=4, custom_hooks=[EMAHook(strict_load=True)], resume=path)
    with pytest.raises(KeyError, match=r"unexpected keys \['extra'\].*strict_load=False"):
        t.train()


def test_resume_from_a_checkpoint_without_ema_state_starts_from_the_loaded_weights(
    trainer_factory: Any, tmp_path: Path
) -> None:
    kw: dict[str, Any] = dict(
        dataset=regression_set(20),
        batch_size=4,
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=dict(interval=1)),
    )
    first = trainer_factory(**kw)
    first.train()
    trained = {k: v.clone() for k, v in first.unwrapped_model.state_dict().items()}
    hook = EMAHook(begin_epoch=2)
    kw["train_cfg"] = dict(by_epoch=True, max_epochs=2)
    resumed = trainer_factory(resume=True, custom_hooks=[hook], **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.resume_from(tmp_path / "checkpoints" / "epoch_1.pth")
    assert any("no state for hook 'EMAHook'" in str(w.message) for w in caught)
    hook.before_train(resumed)
    assert hook.ema.steps == 0
    assert all(torch.equal(hook.state_dict()["averaged"][k], v) for k, v in trained.items())
