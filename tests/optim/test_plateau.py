"""ReduceOnPlateau schedulers against torch's ReduceLROnPlateau on the same metric sequences."""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as tls

from trainwright.optim.scheduler import (
    ReduceOnPlateauLR,
    ReduceOnPlateauMomentum,
    ReduceOnPlateauParamScheduler,
    build_param_schedulers,
)

BASE_LRS = (0.1, 0.05)

# Noisy, plateauing, improving-again sequences: every branch (improve, bad, cooldown, floor) is hit.
LOSSES = [
    1.0,
    0.9,
    0.9,
    0.91,
    0.95,
    0.9,
    0.8,
    0.8,
    0.8,
    0.8,
    0.8,
    0.7999,
    0.79,
    0.85,
    0.9,
    0.9,
    0.9,
    0.9,
    0.9,
    0.9,
    0.5,
    0.5,
    0.5,
    0.5,
    0.5,
    0.5,
]
ACCS = [0.1, 0.3, 0.3, 0.29, 0.3, 0.31, 0.31, 0.31, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]


def sgd(lrs: tuple[float, ...] = BASE_LRS) -> torch.optim.SGD:
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, lr=lrs[0], momentum=0.9)


def lrs(opt: Any, key: str = "lr") -> list[float]:
    return [g[key] for g in opt.param_groups]


CASES = [
    # (our kwargs, torch kwargs, metrics)
    (dict(), dict(), LOSSES + [0.6] * 12),  # the defaults (patience 10)
    (dict(patience=2), dict(patience=2), LOSSES),
    (dict(patience=0, factor=0.5), dict(patience=0, factor=0.5), LOSSES),
    (dict(patience=1, cooldown=2, factor=0.5), dict(patience=1, cooldown=2, factor=0.5), LOSSES),
    (
        dict(patience=1, threshold=0.05, threshold_rule="abs"),
        dict(patience=1, threshold=0.05, threshold_mode="abs"),
        LOSSES,
    ),
    (dict(patience=1, min_value=[0.02, 0.001], factor=0.3), dict(patience=1, min_lr=[0.02, 0.001], factor=0.3), LOSSES),
    (
        dict(patience=0, factor=0.5, min_value=0.04, eps=0.02),
        dict(patience=0, factor=0.5, min_lr=0.04, eps=0.02),
        LOSSES,
    ),
    (dict(rule="greater", patience=1, monitor="acc"), dict(mode="max", patience=1), ACCS),
    (
        dict(rule="greater", patience=0, threshold=0.02, threshold_rule="abs", cooldown=1, monitor="acc"),
        dict(mode="max", patience=0, threshold=0.02, threshold_mode="abs", cooldown=1),
        ACCS,
    ),
]


@pytest.mark.parametrize("ours,theirs,metrics", CASES)
def test_equals_torch_reduce_lr_on_plateau_every_step(
    ours: dict[str, Any], theirs: dict[str, Any], metrics: list[float]
) -> None:
    opt_a, opt_b = sgd(), sgd()
    monitor = ours.pop("monitor", "loss")
    sched = ReduceOnPlateauLR(opt_a, monitor=f"val/{monitor}", **ours)
    ref = tls.ReduceLROnPlateau(opt_b, **theirs)
    for m in metrics:
        opt_a.step()
        opt_b.step()
        sched.step()  # the epoch ends (counts a unit)
        sched.step({f"val/{monitor}": m, "val/other": -1.0})
        ref.step(m)
        assert lrs(opt_a) == pytest.approx(lrs(opt_b), abs=1e-15, rel=0), f"after metric {m}"
        assert sched.get_last_value() == lrs(opt_a)
    assert lrs(opt_a) != list(BASE_LRS), "the sequence must trigger at least one reduction"


def test_monitor_without_val_prefix_is_found_with_it() -> None:
    opt = sgd()
    sched = ReduceOnPlateauLR(opt, monitor="loss", patience=0, factor=0.5)
    for m in (1.0, 2.0):
        sched.step({"val/loss": m})
    assert lrs(opt) == [0.05, 0.025]
    sched.step({"loss": 3.0})  # the exact key first
    assert lrs(opt) == [0.025, 0.0125]


def test_tensor_metric_is_accepted() -> None:
    opt = sgd()
    sched = ReduceOnPlateauLR(opt, monitor="val/loss", patience=0, factor=0.5)
    sched.step({"val/loss": torch.tensor(1.0)})
    sched.step({"val/loss": torch.tensor(1.5)})
    assert lrs(opt) == [0.05, 0.025]


def test_missing_monitor_names_key_available_keys_and_fix() -> None:
    sched = ReduceOnPlateauLR(sgd(), monitor="val/los")
    with pytest.raises(
        KeyError,
        match=r"monitor 'val/los' is not among the validation metrics \['val/acc', 'val/loss'\].*Did you mean "
        r"'val/loss'.*Set monitor to one of them",
    ):
        sched.step({"val/loss": 1.0, "val/acc": 0.5})
    with pytest.raises(KeyError, match="reported none.*val_evaluator"):
        sched.step({})
    with pytest.raises(TypeError, match="as a dict"):
        sched.step(0.5)  # type: ignore[arg-type]


def test_window_counts_units_and_only_validations_inside_it_act() -> None:
    opt = sgd()
    sched = ReduceOnPlateauLR(opt, monitor="val/loss", patience=0, factor=0.5, begin=2, end=4)
    seen = []
    for epoch in range(1, 7):  # after epoch e the global step is e: validations after epochs 2 and 3 act
        sched.step()
        sched.step({"val/loss": float(epoch)})  # always worse
        seen.append(lrs(opt)[0])
    assert seen == [0.1, 0.1, 0.05, 0.05, 0.05, 0.05]  # epoch 2 sets the baseline, epoch 3 reduces
    assert sched.last_step == 1


def test_momentum_version_reduces_betas_for_adam() -> None:
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], betas=(0.9, 0.99))
    sched = ReduceOnPlateauMomentum(opt, monitor="val/acc", rule="greater", patience=0, factor=0.5)
    sched.step({"val/acc": 0.5})
    sched.step({"val/acc": 0.4})
    assert opt.param_groups[0]["betas"] == pytest.approx((0.45, 0.99))


def test_generic_scheduler_on_weight_decay() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, weight_decay=1e-2)
    sched = ReduceOnPlateauParamScheduler(
        opt, "weight_decay", monitor="val/loss", patience=0, factor=0.1, min_value=5e-4
    )
    for m in (1.0, 1.0, 1.0):
        sched.step({"val/loss": m})
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(5e-4)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(factor=1.0), "factor must be in \\[0, 1\\)"),
        (dict(rule="min"), "rule must be 'less'"),
        (dict(threshold_rule="relative"), "threshold_rule must be 'rel'"),
        (dict(patience=-1), "patience must be an int >= 0"),
        (dict(cooldown=1.5), "cooldown must be an int >= 0"),
        (dict(threshold=-0.1), "threshold and eps must be >= 0"),
        (dict(min_value=[0.0]), "min_value has 1 values but the optimizer has 2 param groups"),
        (dict(monitor=""), "monitor must be a metric key"),
    ],
)
def test_bad_arguments_are_explained(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ReduceOnPlateauLR(sgd(), **kwargs)


def test_state_dict_round_trip_mid_run_equals_uninterrupted() -> None:
    def make(opt: Any) -> ReduceOnPlateauLR:
        return ReduceOnPlateauLR(opt, monitor="val/loss", patience=1, cooldown=1, factor=0.5, min_value=0.01)

    full_opt = sgd()
    full = make(full_opt)
    want = []
    for m in LOSSES:
        full.step()
        full.step({"val/loss": m})
        want.append(lrs(full_opt))

    opt = sgd()
    first = make(opt)
    got = []
    for m in LOSSES[:9]:
        first.step()
        first.step({"val/loss": m})
        got.append(lrs(opt))
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "sched": first.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    opt2 = sgd()
    resumed = make(opt2)
    opt2.load_state_dict(saved["opt"])
    resumed.load_state_dict(saved["sched"])
    assert resumed.best == first.best and resumed.num_bad_epochs == first.num_bad_epochs
    for m in LOSSES[9:]:
        resumed.step()
        resumed.step({"val/loss": m})
        got.append(lrs(opt2))
    assert got == want
    assert math.isinf(make(sgd()).state_dict()["best"])


def test_registered_for_configs() -> None:
    opt = sgd()
    built = build_param_schedulers(
        [
            dict(type="ReduceOnPlateauLR", monitor="val/acc", rule="greater", patience=3),
            dict(type="ReduceOnPlateauMomentum", monitor="val/acc", rule="greater"),
            dict(type="ReduceOnPlateauParamScheduler", param_name="weight_decay", monitor="val/acc", rule="greater"),
        ],
        opt,
        max_epochs=10,
    )
    assert [type(s).__name__ for s in built] == [
        "ReduceOnPlateauLR",
        "ReduceOnPlateauMomentum",
        "ReduceOnPlateauParamScheduler",
    ]
    assert all(s.need_val_args and s.end == 10 for s in built)
