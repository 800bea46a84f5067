"""Misuse warnings in hand-written loops, as torch gives them, checked once and then free."""

from __future__ import annotations

import io
import warnings
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as tls

from trainwright.optim import OptimWrapper
from trainwright.optim.scheduler import CosineRestartLR, ExponentialLR, OneCycleLR, ReduceOnPlateauLR, StepMomentum


def sgd() -> torch.optim.SGD:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)


def user_warnings(fn: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


MAKERS = [
    lambda o: ExponentialLR(o, gamma=0.9),
    lambda o: StepMomentum(o, step_size=1),
    lambda o: CosineRestartLR(o, periods=[3], eta_min=0.0),
    lambda o: OneCycleLR(o, eta_max=1.0, total_steps=5, cycle_momentum=True),
]


@pytest.mark.parametrize("make", MAKERS)
def test_scheduler_step_before_optimizer_step_warns_once_like_torch(make: Any) -> None:
    opt, torch_opt = sgd(), sgd()
    sched = make(opt)
    ref = tls.ExponentialLR(torch_opt, gamma=0.9)
    ours = user_warnings(sched.step)
    theirs = user_warnings(ref.step)
    assert len(ours) == 1 and len(theirs) == 1
    assert "step() was called before the first optimizer.step()" in ours[0] and "Call optimizer.step() first" in ours[0]
    assert user_warnings(lambda: [sched.step() for _ in range(3)]) == []  # once only


@pytest.mark.parametrize("make", MAKERS)
def test_right_order_does_not_warn(make: Any) -> None:
    opt = sgd()
    sched = make(opt)

    def loop() -> None:
        for _ in range(3):
            opt.step()
            sched.step()

    assert user_warnings(loop) == []


def test_optimizer_step_replaced_after_the_scheduler_warns() -> None:
    opt = sgd()
    sched = ExponentialLR(opt, gamma=0.9)
    original = opt.step
    opt.step = lambda *a, **k: original(*a, **k)  # type: ignore[method-assign]
    opt.step()
    (msg,) = user_warnings(sched.step)
    assert "optimizer.step was replaced after ExponentialLR was built" in msg and "before building the scheduler" in msg


def test_optimizer_step_replaced_before_the_scheduler_is_fine() -> None:
    opt = sgd()
    original = opt.step
    opt.step = lambda *a, **k: original(*a, **k)  # type: ignore[method-assign]
    sched = ExponentialLR(opt, gamma=0.9)
    opt.step()
    assert user_warnings(sched.step) == []


def test_watches_the_optimizer_inside_an_optim_wrapper() -> None:
    opt = sgd()
    wrapper = OptimWrapper(opt)
    sched = ExponentialLR(wrapper, gamma=0.9)
    assert len(user_warnings(sched.step)) == 1
    sched2 = ExponentialLR(OptimWrapper(sgd()), gamma=0.9)
    sched2.optimizer.step()
    assert user_warnings(sched2.step) == []


def test_nothing_remains_on_the_step_path_after_the_first_step() -> None:
    opt = sgd()
    sched = ExponentialLR(opt, gamma=0.9)
    assert len(opt._optimizer_step_post_hooks) == 1 and "step" in sched.__dict__
    opt.step()
    sched.step()
    assert len(opt._optimizer_step_post_hooks) == 0  # the optimizer's step has no extra hook
    assert "step" not in sched.__dict__ and sched._step_watch is None  # the scheduler's step is the class method


def test_disable_step_order_check_silences_and_unhooks() -> None:
    opt = sgd()
    sched = ExponentialLR(opt, gamma=0.9)
    sched.disable_step_order_check()
    assert len(opt._optimizer_step_post_hooks) == 0
    assert user_warnings(sched.step) == []


def test_plateau_scheduler_does_not_check_like_torch() -> None:
    opt = sgd()
    sched = ReduceOnPlateauLR(opt, monitor="val/loss")
    assert len(opt._optimizer_step_post_hooks) == 0
    assert user_warnings(lambda: (sched.step(), sched.step({"val/loss": 1.0}))) == []


def test_state_dict_holds_no_watch_and_loads_weights_only() -> None:
    sched = ExponentialLR(sgd(), gamma=0.9)
    state = sched.state_dict()
    assert "step" not in state and "_step_watch" not in state and "optimizer" not in state
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    other = ExponentialLR(sgd(), gamma=0.9)
    other.load_state_dict(torch.load(buf, weights_only=True))
    assert "step" in other.__dict__  # loading keeps the new scheduler's own first-step check


def test_a_deep_copy_is_not_watched_through_the_original_optimizer() -> None:
    import copy

    sched = ExponentialLR(sgd(), gamma=0.9)
    twin = copy.deepcopy(sched)
    twin.optimizer.step()
    assert user_warnings(twin.step) == [] and twin.optimizer.param_groups[0]["lr"] == pytest.approx(0.09)
    assert len(user_warnings(sched.step)) == 1  # the original still checks its own optimizer


ROUND_TRIP = [
    lambda o: ExponentialLR(o, gamma=0.9),
    lambda o: StepMomentum(o, step_size=1),
    lambda o: CosineRestartLR(o, periods=[3], eta_min=0.0),
    lambda o: OneCycleLR(o, eta_max=1.0, total_steps=10, cycle_momentum=True),
    lambda o: ReduceOnPlateauLR(o, monitor="loss", patience=1),
]


@pytest.mark.parametrize("make", ROUND_TRIP)
def test_state_dict_round_trip_leaves_every_attribute_equal_and_does_not_warn(make: Any) -> None:
    # mmengine's scheduler tests compare scheduler.__dict__ (all but the optimizer) after load_state_dict
    opt = sgd()
    sched = make(opt)
    for _ in range(3):
        opt.step()
        sched.step({"loss": 1.0}) if sched.need_val_args else sched.step()
    copy_opt = sgd()
    copy_opt.load_state_dict(opt.state_dict())
    copy = make(copy_opt)
    copy.load_state_dict(sched.state_dict())
    mine = {k: v for k, v in sched.__dict__.items() if k != "optimizer"}
    theirs = {k: v for k, v in copy.__dict__.items() if k != "optimizer"}
    assert mine == theirs
    # restored mid-schedule: no misuse warning on its next step, though copy_opt has not stepped since
    assert user_warnings(lambda: copy.step({"loss": 1.0}) if copy.need_val_args else copy.step()) == []


@pytest.mark.parametrize("make", MAKERS)
def test_misuse_warnings_carry_torchs_wording_and_link(make: Any) -> None:
    before = user_warnings(make(sgd()).step)[0]
    assert "Detected call of `" in before and "before `optimizer.step()`" in before
    assert "https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate" in before
    opt = sgd()
    sched = make(opt)
    opt.step = lambda *a, **k: None  # type: ignore[method-assign]
    replaced = user_warnings(sched.step)[0]
    assert (
        "Seems like `optimizer.step()` has been overridden" in replaced
        and "optim.html#how-to-adjust-learning-rate" in replaced
    )
