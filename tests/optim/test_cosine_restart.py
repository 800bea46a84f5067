"""CosineRestart schedulers against the closed form, converted to iterations, resumed, misconfigured."""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
import torch

from trainwright.optim.scheduler import (
    CosineRestartLR,
    CosineRestartMomentum,
    CosineRestartParamScheduler,
    build_param_schedulers,
)

BASE_LRS = (0.1, 0.05)
TOL = 1e-12


def sgd(lrs: tuple[float, ...] = BASE_LRS) -> torch.optim.SGD:
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, lr=lrs[0], momentum=0.9)


def run(opt: Any, sched: Any, steps: int, key: str = "lr") -> list[list[float]]:
    seq = [[g[key] for g in opt.param_groups]]
    for _ in range(steps):
        opt.step()
        sched.step()
        seq.append([g[key] for g in opt.param_groups])
    return seq


def closed_form(base: float, t: int, periods: list[int], weights: list[float], floor: float) -> float | None:
    """The value at step t since begin; None past the last period (the value is then held)."""
    start = 0
    for period, weight in zip(periods, weights):
        if t < start + period:
            s = t - start
            return floor + (base * weight - floor) * (1 + math.cos(math.pi * s / period)) / 2
        start += period
    return None


def expected(
    periods: list[int],
    weights: list[float],
    steps: int,
    eta_min: float | None = None,
    ratio: float | None = None,
    begin: int = 0,
) -> list[list[float]]:
    out: list[list[float]] = []
    for step in range(steps + 1):
        row = []
        for base in BASE_LRS:
            floor = base * ratio if ratio is not None else float(eta_min or 0.0)
            if step < begin:
                row.append(base)
                continue
            v = closed_form(base, step - begin, periods, weights, floor)
            row.append(v if v is not None else out[-1][len(row)])
        out.append(row)
    return out


def assert_seq(got: list[list[float]], want: list[list[float]]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == pytest.approx(w, abs=TOL, rel=0), f"step {i}: got {g}, expected {w}"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(periods=[5, 10, 4], restart_weights=[1.0, 0.5, 0.25], eta_min=0.001),
        dict(periods=[3, 3, 3], eta_min_ratio=0.1),
        dict(periods=[7], restart_weights=[0.8], eta_min=0.0),
        dict(periods=[4, 6], restart_weights=[1.0, 0.6], eta_min_ratio=0.05, begin=3),
    ],
)
def test_matches_closed_form_and_holds_after_the_last_period(kwargs: dict[str, Any]) -> None:
    opt = sgd()
    steps = sum(kwargs["periods"]) + kwargs.get("begin", 0) + 4
    got = run(opt, CosineRestartLR(opt, **kwargs), steps)
    weights = kwargs.get("restart_weights", [1.0] * len(kwargs["periods"]))
    assert_seq(
        got,
        expected(
            kwargs["periods"],
            weights,
            steps,
            kwargs.get("eta_min"),
            kwargs.get("eta_min_ratio"),
            kwargs.get("begin", 0),
        ),
    )


def test_restart_jumps_back_to_the_weighted_peak() -> None:
    opt = sgd((1.0,))
    seq = run(opt, CosineRestartLR(opt, periods=[4, 4], restart_weights=[1.0, 0.5], eta_min=0.0), 8)
    assert seq[3][0] < 0.2 and seq[4][0] == pytest.approx(0.5) and seq[0][0] == pytest.approx(1.0)


def test_convert_to_iter_based_is_the_closed_form_per_iteration() -> None:
    epoch_length = 5
    opt = sgd()
    (sched,) = build_param_schedulers(
        [
            dict(
                type="CosineRestartLR",
                periods=[2, 3],
                restart_weights=[1.0, 0.5],
                eta_min=1e-4,
                begin=1,
                end=7,
                convert_to_iter_based=True,
            )
        ],
        opt,
        epoch_length=epoch_length,
    )
    assert (sched.by_epoch, sched.periods, sched.begin, sched.end) == (False, [10, 15], 5, 35)
    steps = 40
    got = run(opt, sched, steps)
    want = expected([10, 15], [1.0, 0.5], steps, eta_min=1e-4, begin=5)
    assert_seq(got[:35], want[:35])
    assert all(row == got[34] for row in got[35:])  # the window has closed: held


def test_momentum_version_on_adam_betas() -> None:
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], betas=(0.9, 0.999))
    got = run(opt, CosineRestartMomentum(opt, periods=[3, 3], restart_weights=[1.0, 0.9], eta_min=0.8), 6, key="betas")
    want = [closed_form(0.9, t, [3, 3], [1.0, 0.9], 0.8) for t in range(6)]
    assert [b[0][0] for b in got[:6]] == pytest.approx(want, abs=TOL)
    assert all(b[0][1] == 0.999 for b in got)


def test_generic_scheduler_on_weight_decay() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, weight_decay=0.01)
    got = run(opt, CosineRestartParamScheduler(opt, "weight_decay", periods=[4], eta_min=0.0), 3, key="weight_decay")
    assert [g[0] for g in got] == pytest.approx([closed_form(0.01, t, [4], [1.0], 0.0) for t in range(4)], abs=TOL)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(periods=[5]), "exactly one of eta_min .* got neither"),
        (dict(periods=[5], eta_min=0.0, eta_min_ratio=0.1), "exactly one of eta_min .* got both"),
        (dict(periods=[5, 5], restart_weights=[1.0], eta_min=0.0), "restart_weights has 1 values but periods has 2"),
        (dict(periods=[], eta_min=0.0), "periods must be a non-empty list of positive ints"),
        (dict(periods=[5, 0], eta_min=0.0), "periods must be a non-empty list of positive ints"),
        (dict(periods=5, eta_min=0.0), "periods must be a non-empty list"),
    ],
)
def test_bad_arguments_are_explained(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CosineRestartLR(sgd(), **kwargs)


def test_state_dict_round_trip_mid_run_equals_uninterrupted() -> None:
    def make(opt: Any) -> CosineRestartLR:
        return CosineRestartLR(opt, periods=[4, 5, 6], restart_weights=[1.0, 0.7, 0.4], eta_min_ratio=0.1)

    full_opt = sgd()
    want = run(full_opt, make(full_opt), 18)
    opt = sgd()
    first = make(opt)
    got = run(opt, first, 7)
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "sched": first.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    opt2 = sgd()
    resumed = make(opt2)
    opt2.load_state_dict(saved["opt"])
    resumed.load_state_dict(saved["sched"])
    got += run(opt2, resumed, 11)[1:]
    assert_seq(got, want)


def test_registered_for_configs() -> None:
    built = build_param_schedulers(
        [
            dict(type="CosineRestartLR", periods=[2], eta_min=0.0),
            dict(type="CosineRestartMomentum", periods=[2], eta_min=0.85),
            dict(type="CosineRestartParamScheduler", param_name="weight_decay", periods=[2], eta_min_ratio=0.5),
        ],
        sgd(),
    )
    assert [type(s).__name__ for s in built] == [
        "CosineRestartLR",
        "CosineRestartMomentum",
        "CosineRestartParamScheduler",
    ]
