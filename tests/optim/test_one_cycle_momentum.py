"""OneCycleLR(cycle_momentum=True) against torch's OneCycleLR: learning rate and momentum / betas every step."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as tls

from trainwright.optim.scheduler import OneCycleLR, build_param_schedulers

TOL = 1e-12


def make_opt(kind: str) -> torch.optim.Optimizer:
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in (0.1, 0.05)]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(groups, betas=(0.9, 0.98))


def momenta(opt: torch.optim.Optimizer) -> list[float]:
    return [g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups]


def snapshot(opt: torch.optim.Optimizer) -> list[float]:
    return (
        [g["lr"] for g in opt.param_groups] + momenta(opt) + [g["betas"][1] for g in opt.param_groups if "betas" in g]
    )


CASES = [
    ("two-phase-cos", dict(eta_max=[1.0, 0.5], total_steps=20), dict(max_lr=[1.0, 0.5], total_steps=20)),
    (
        "three-phase-linear",
        dict(
            eta_max=0.8,
            total_steps=25,
            pct_start=0.25,
            anneal_strategy="linear",
            three_phase=True,
            base_momentum=0.8,
            max_momentum=0.92,
        ),
        dict(
            max_lr=0.8,
            total_steps=25,
            pct_start=0.25,
            anneal_strategy="linear",
            three_phase=True,
            base_momentum=0.8,
            max_momentum=0.92,
        ),
    ),
    (
        "per-group-momenta",
        dict(eta_max=0.5, total_steps=12, base_momentum=[0.8, 0.7], max_momentum=[0.95, 0.9]),
        dict(max_lr=0.5, total_steps=12, base_momentum=[0.8, 0.7], max_momentum=[0.95, 0.9]),
    ),
]


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("name,ours,theirs", CASES, ids=[c[0] for c in CASES])
def test_lr_and_momentum_equal_torch_every_step(
    kind: str, name: str, ours: dict[str, Any], theirs: dict[str, Any]
) -> None:
    opt_a, opt_b = make_opt(kind), make_opt(kind)
    sched = OneCycleLR(opt_a, cycle_momentum=True, **ours)
    ref = tls.OneCycleLR(opt_b, cycle_momentum=True, **theirs)
    steps = ours["total_steps"]
    assert snapshot(opt_a) == pytest.approx(snapshot(opt_b), abs=TOL)
    for step in range(steps - 1):
        opt_a.step()
        opt_b.step()
        sched.step()
        ref.step()
        assert snapshot(opt_a) == pytest.approx(snapshot(opt_b), abs=TOL), f"step {step + 1}"


def test_momentum_is_left_alone_by_default() -> None:
    opt = make_opt("sgd")
    sched = OneCycleLR(opt, eta_max=1.0, total_steps=10)
    for _ in range(5):
        opt.step()
        sched.step()
    assert momenta(opt) == [0.9, 0.9]


def test_cycle_momentum_needs_momentum_or_betas() -> None:
    opt = torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match="neither `momentum` nor `betas`.*cycle_momentum=False"):
        OneCycleLR(opt, eta_max=1.0, total_steps=10, cycle_momentum=True)
    with pytest.raises(ValueError, match="base_momentum has 3 values but the optimizer has 2 param groups"):
        OneCycleLR(make_opt("sgd"), eta_max=1.0, total_steps=10, cycle_momentum=True, base_momentum=[0.8, 0.8, 0.8])


def test_convert_to_iter_based_cycles_momentum_per_iteration() -> None:
    opt_a, opt_b = make_opt("sgd"), make_opt("sgd")
    (sched,) = build_param_schedulers(
        [dict(type="OneCycleLR", eta_max=0.4, total_steps=4, cycle_momentum=True, convert_to_iter_based=True)],
        opt_a,
        epoch_length=5,
    )
    ref = tls.OneCycleLR(opt_b, max_lr=0.4, total_steps=20)
    for _ in range(19):
        opt_a.step()
        opt_b.step()
        sched.step()
        ref.step()
        assert snapshot(opt_a) == pytest.approx(snapshot(opt_b), abs=TOL)


def test_state_dict_round_trip_mid_run_equals_uninterrupted() -> None:
    def make(opt: Any) -> OneCycleLR:
        return OneCycleLR(opt, eta_max=0.6, total_steps=16, three_phase=True, cycle_momentum=True)

    full_opt = make_opt("adamw")
    full = make(full_opt)
    want = []
    for _ in range(15):
        full_opt.step()
        full.step()
        want.append(snapshot(full_opt))
    opt = make_opt("adamw")
    first = make(opt)
    got = []
    for _ in range(6):
        opt.step()
        first.step()
        got.append(snapshot(opt))
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "sched": first.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    opt2 = make_opt("adamw")
    resumed = make(opt2)
    opt2.load_state_dict(saved["opt"])
    resumed.load_state_dict(saved["sched"])
    for _ in range(9):
        opt2.step()
        resumed.step()
        got.append(snapshot(opt2))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=TOL)
