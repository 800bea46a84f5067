"""Parameter schedulers against torch's own schedulers and closed-form schedules.

Every scheduler is driven step by step on a real optimizer; the value in each param group
after each step must equal torch's scheduler on an identical optimizer, or the closed form
of the schedule, within 1e-10.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as tls

from trainwright.optim.scheduler import (
    INF,
    ConstantLR,
    ConstantMomentum,
    CosineAnnealingLR,
    CosineAnnealingMomentum,
    CosineAnnealingParamScheduler,
    ExponentialLR,
    ExponentialMomentum,
    LinearLR,
    LinearMomentum,
    MultiStepLR,
    MultiStepMomentum,
    OneCycleLR,
    ParamScheduler,
    PolyLR,
    PolyMomentum,
    StepLR,
    StepMomentum,
    build_param_schedulers,
)
from trainwright.registry import PARAM_SCHEDULERS

TOL = 1e-10
BASE_LRS = (0.1, 0.05)


def sgd(lrs: tuple[float, ...] = BASE_LRS, momentum: float = 0.9) -> torch.optim.SGD:
    """An SGD with one param group per learning rate (groups must be scheduled independently)."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, lr=lrs[0], momentum=momentum)


def adam(lrs: tuple[float, ...] = BASE_LRS, betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.Adam:
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs]
    return torch.optim.Adam(groups, betas=betas)


def values(opt: Any, key: str = "lr") -> list[float]:
    return [g[key] for g in opt.param_groups]


def drive(opt: Any, scheduler: Any, steps: int, key: str = "lr") -> list[list[float]]:
    """Values in use at steps 0..steps (optimizer.step() before scheduler.step(), as in training)."""
    seq = [values(opt, key)]
    for _ in range(steps):
        opt.step()
        scheduler.step()
        seq.append(values(opt, key))
    return seq


def assert_close_seq(got: list[list[float]], want: list[list[float]]) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        for a, b in zip(g, w):
            assert abs(a - b) <= TOL, f"step {step}: got {g}, expected {w}"


def cosine(base: float, t: int, T: int, eta_min: float = 0.0) -> float:
    return eta_min + (base - eta_min) * (1 + math.cos(math.pi * t / T)) / 2


# (ours, torch equivalent, steps). mmengine's window ends one step after torch's total_iters:
# the last step inside [begin, end) is the one that reaches the final value.
TORCH_PARITY: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any], int]] = [
    (
        "ConstantLR",
        lambda o: ConstantLR(o, factor=0.5, end=5),
        lambda o: tls.ConstantLR(o, factor=0.5, total_iters=4),
        10,
    ),
    (
        "LinearLR",
        lambda o: LinearLR(o, start_factor=0.25, end_factor=0.9, end=7),
        lambda o: tls.LinearLR(o, 0.25, 0.9, total_iters=6),
        12,
    ),
    ("StepLR", lambda o: StepLR(o, step_size=3, gamma=0.5), lambda o: tls.StepLR(o, step_size=3, gamma=0.5), 14),
    (
        "MultiStepLR",
        lambda o: MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.3),
        lambda o: tls.MultiStepLR(o, [2, 5, 5, 9], 0.3),
        12,
    ),
    ("ExponentialLR", lambda o: ExponentialLR(o, gamma=0.9), lambda o: tls.ExponentialLR(o, gamma=0.9), 20),
    (
        "CosineAnnealingLR",
        lambda o: CosineAnnealingLR(o, T_max=10, eta_min=0.001),
        lambda o: tls.CosineAnnealingLR(o, T_max=10, eta_min=0.001),
        35,
    ),
    ("PolyLR", lambda o: PolyLR(o, power=2.0, end=11), lambda o: tls.PolynomialLR(o, total_iters=10, power=2.0), 15),
    (
        "OneCycleLR",
        lambda o: OneCycleLR(o, eta_max=[1.0, 0.5], total_steps=20),
        lambda o: tls.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=20, cycle_momentum=False),
        20,
    ),
    (
        "OneCycleLR-3phase-linear",
        lambda o: OneCycleLR(
            o,
            eta_max=0.8,
            total_steps=25,
            pct_start=0.25,
            anneal_strategy="linear",
            three_phase=True,
            div_factor=10.0,
            final_div_factor=100.0,
        ),
        lambda o: tls.OneCycleLR(
            o,
            max_lr=0.8,
            total_steps=25,
            pct_start=0.25,
            anneal_strategy="linear",
            three_phase=True,
            div_factor=10.0,
            final_div_factor=100.0,
            cycle_momentum=False,
        ),
        25,
    ),
]


@pytest.mark.parametrize("name,ours,theirs,steps", TORCH_PARITY, ids=[c[0] for c in TORCH_PARITY])
def test_lr_matches_torch_scheduler(
    name: str, ours: Callable[[Any], Any], theirs: Callable[[Any], Any], steps: int
) -> None:
    opt_a, opt_b = sgd(), sgd()
    got = drive(opt_a, ours(opt_a), steps)
    want = drive(opt_b, theirs(opt_b), steps)
    assert_close_seq(got, want)


@pytest.mark.parametrize("eta", [dict(eta_min=0.002), dict(eta_min_ratio=0.1)])
def test_cosine_matches_closed_form_past_t_max(eta: dict[str, float]) -> None:
    opt = sgd()
    T = 7
    got = drive(opt, CosineAnnealingLR(opt, T_max=T, **eta), 3 * T)
    want = [
        [cosine(b, t, T, eta.get("eta_min", b * eta.get("eta_min_ratio", 0.0))) for b in BASE_LRS]
        for t in range(3 * T + 1)
    ]
    assert_close_seq(got, want)


def test_cosine_t_max_defaults_to_window_length() -> None:
    opt = sgd()
    got = drive(opt, CosineAnnealingLR(opt, begin=2, end=10), 12)
    expected = [[cosine(b, min(max(t - 2, 0), 7), 8) for b in BASE_LRS] for t in range(13)]
    assert_close_seq(got, expected)


def test_poly_closed_form_with_eta_min() -> None:
    opt = sgd()
    got = drive(opt, PolyLR(opt, eta_min=0.01, power=0.5, end=9), 12)
    T = 8
    want = [[0.01 + (b - 0.01) * (1 - min(t, T) / T) ** 0.5 for b in BASE_LRS] for t in range(13)]
    assert_close_seq(got, want)


def test_generic_param_scheduler_on_weight_decay_matches_torch_on_lr() -> None:
    """A generic scheduler on any key follows the same schedule as torch's on ``lr``."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "weight_decay": wd} for wd in BASE_LRS]
    opt = torch.optim.SGD(groups, lr=0.1)
    got = drive(opt, CosineAnnealingParamScheduler(opt, "weight_decay", T_max=6), 10, key="weight_decay")
    ref = sgd()
    want = drive(ref, tls.CosineAnnealingLR(ref, T_max=6), 10)
    assert_close_seq(got, want)
    assert all(g["lr"] == 0.1 for g in opt.param_groups)


# ---------------------------------------------------------------- momentum

MOMENTUM_PARITY: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = [
    (
        "Constant",
        lambda o: ConstantMomentum(o, factor=0.5, end=4),
        lambda o: tls.ConstantLR(o, factor=0.5, total_iters=3),
    ),
    (
        "Linear",
        lambda o: LinearMomentum(o, start_factor=0.5, end=6),
        lambda o: tls.LinearLR(o, 0.5, 1.0, total_iters=5),
    ),
    ("Step", lambda o: StepMomentum(o, step_size=2, gamma=0.8), lambda o: tls.StepLR(o, 2, 0.8)),
    (
        "MultiStep",
        lambda o: MultiStepMomentum(o, milestones=[1, 4], gamma=0.5),
        lambda o: tls.MultiStepLR(o, [1, 4], 0.5),
    ),
    ("Exponential", lambda o: ExponentialMomentum(o, gamma=0.95), lambda o: tls.ExponentialLR(o, 0.95)),
    (
        "Cosine",
        lambda o: CosineAnnealingMomentum(o, T_max=5, eta_min=0.85),
        lambda o: tls.CosineAnnealingLR(o, T_max=5, eta_min=0.85),
    ),
    ("Poly", lambda o: PolyMomentum(o, eta_min=0.5, power=1.0, end=7), None),
]


@pytest.mark.parametrize("make_opt", ["sgd", "adam"])
@pytest.mark.parametrize("name,ours,theirs", MOMENTUM_PARITY, ids=[c[0] for c in MOMENTUM_PARITY])
def test_momentum_schedule(
    make_opt: str, name: str, ours: Callable[[Any], Any], theirs: Callable[[Any], Any] | None
) -> None:
    """Momentum (SGD) / betas[0] (Adam) follow torch's schedule run on an lr equal to the momentum."""
    bases = (0.95, 0.9)
    if make_opt == "sgd":
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "momentum": m} for m in bases]
        opt: Any = torch.optim.SGD(groups, lr=0.01)
    else:
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "betas": (m, 0.99)} for m in bases]
        opt = torch.optim.Adam(groups, lr=0.01)
    steps = 10
    sched = ours(opt)
    seq, betas1 = [], []
    for t in range(steps + 1):
        if t:
            opt.step()
            sched.step()
        key = "momentum" if make_opt == "sgd" else "betas"
        seq.append([g[key] if key == "momentum" else g["betas"][0] for g in opt.param_groups])
        betas1.extend(g["betas"][1] for g in opt.param_groups if "betas" in g)
        assert sched.get_last_value() == [g["momentum"] for g in opt.param_groups]
        assert all(g["lr"] == 0.01 for g in opt.param_groups)
    if theirs is not None:
        ref = sgd(lrs=bases)
        want = drive(ref, theirs(ref), steps)
    else:  # torch has no polynomial decay with eta_min: closed form
        want = [[0.5 + (b - 0.5) * (1 - min(t, 6) / 6) for b in bases] for t in range(steps + 1)]
    assert_close_seq(seq, want)
    assert all(b == 0.99 for b in betas1)


def test_momentum_needs_momentum_or_betas() -> None:
    opt = torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="neither `momentum` nor `betas`"):
        CosineAnnealingMomentum(opt, T_max=3)


def test_two_momentum_schedulers_chain_on_adam() -> None:
    opt = adam(betas=(0.9, 0.999))
    warm = LinearMomentum(opt, start_factor=0.5, end=3, by_epoch=False)
    decay = ExponentialMomentum(opt, gamma=0.9)
    seq = [[g["betas"][0] for g in opt.param_groups]]
    for _ in range(5):
        opt.step()
        warm.step()
        decay.step()
        seq.append([g["betas"][0] for g in opt.param_groups])
    linear = [0.5, 0.75, 1.0, 1.0, 1.0, 1.0]
    assert_close_seq(seq, [[0.9 * linear[t] * 0.9**t] * 2 for t in range(6)])


# ---------------------------------------------------------------- windows and chaining


def test_begin_end_window_closed_form() -> None:
    opt = sgd()
    got = drive(opt, StepLR(opt, step_size=2, gamma=0.5, begin=3, end=10), 15)

    def closed(b: float, t: int) -> float:
        if t < 3:
            return b
        return b * 0.5 ** ((min(t, 9) - 3) // 2)

    assert_close_seq(got, [[closed(b, t) for b in BASE_LRS] for t in range(16)])


def test_exponential_window_then_frozen() -> None:
    opt = sgd()
    got = drive(opt, ExponentialLR(opt, gamma=0.8, begin=2, end=6), 9)
    assert_close_seq(got, [[b * 0.8 ** min(max(t - 2, 0), 3) for b in BASE_LRS] for t in range(10)])


def test_end_must_exceed_begin() -> None:
    with pytest.raises(ValueError, match="end .* must be larger than begin"):
        StepLR(sgd(), step_size=1, begin=5, end=5)


def test_warmup_iters_then_cosine_epochs_chain_multiplicatively() -> None:
    """Linear warmup over iterations 0..50 on top of a cosine over epochs 0..10 (hook order)."""
    epoch_length, epochs, warm_end, start = 20, 10, 50, 0.1
    opt = sgd()
    scheds = build_param_schedulers(
        [
            dict(type="LinearLR", start_factor=start, by_epoch=False, begin=0, end=warm_end),
            dict(type="CosineAnnealingLR", T_max=epochs, by_epoch=True, begin=0, end=epochs),
        ],
        opt,
    )
    assert isinstance(scheds, list)
    got, want = [], []
    it = 0
    for epoch in range(epochs):
        for _ in range(epoch_length):
            got.append(values(opt))
            w = start + (1 - start) * min(it, warm_end - 1) / (warm_end - 1)
            want.append([b * w * (1 + math.cos(math.pi * epoch / epochs)) / 2 for b in BASE_LRS])
            opt.step()
            for s in scheds:
                if not s.by_epoch:
                    s.step()
            it += 1
        for s in scheds:
            if s.by_epoch:
                s.step()
    assert_close_seq(got, want)


# ---------------------------------------------------------------- convert_to_iter_based


def test_convert_to_iter_based_cosine_is_per_iteration_closed_form() -> None:
    L, T = 5, 4
    opt_iter, opt_epoch = sgd(), sgd()
    [per_iter] = build_param_schedulers(
        dict(type="CosineAnnealingLR", T_max=T, end=T, convert_to_iter_based=True), opt_iter, epoch_length=L
    )
    [per_epoch] = build_param_schedulers(dict(type="CosineAnnealingLR", T_max=T, end=T), opt_epoch)
    assert (per_iter.by_epoch, per_iter.begin, per_iter.end, per_iter.T_max) == (False, 0, T * L, T * L)
    iters = drive(opt_iter, per_iter, T * L)
    epochs = drive(opt_epoch, per_epoch, T)
    assert_close_seq(iters, [[cosine(b, min(k, T * L - 1), T * L) for b in BASE_LRS] for k in range(T * L + 1)])
    # At each epoch boundary the per-iteration schedule is where the per-epoch one is.
    assert_close_seq([iters[e * L] for e in range(T)], epochs[:T])


@pytest.mark.parametrize(
    "cfg",
    [
        dict(type="StepLR", step_size=2, gamma=0.5),
        dict(type="MultiStepLR", milestones=[1, 3], gamma=0.2),
        dict(type="StepLR", step_size=1, gamma=0.5, begin=1, end=4),
    ],
    ids=["step", "multistep", "step-window"],
)
def test_convert_to_iter_based_piecewise_equals_epoch_schedule_expanded(cfg: dict[str, Any]) -> None:
    L, E = 3, 6
    opt_iter, opt_epoch = sgd(), sgd()
    [per_iter] = build_param_schedulers({**cfg, "convert_to_iter_based": True}, opt_iter, epoch_length=L)
    [per_epoch] = build_param_schedulers(cfg, opt_epoch)
    iters = drive(opt_iter, per_iter, E * L - 1)
    epochs = drive(opt_epoch, per_epoch, E - 1)
    assert_close_seq(iters, [epochs[k // L] for k in range(E * L)])


def test_convert_scales_one_cycle_total_steps() -> None:
    opt_a, opt_b = sgd(), sgd()
    [s] = build_param_schedulers(
        dict(type="OneCycleLR", eta_max=1.0, total_steps=4, convert_to_iter_based=True), opt_a, epoch_length=5
    )
    assert s.total_steps == 20
    assert_close_seq(
        drive(opt_a, s, 20), drive(opt_b, tls.OneCycleLR(opt_b, max_lr=1.0, total_steps=20, cycle_momentum=False), 20)
    )


def test_default_end_from_training_length() -> None:
    opt = sgd()
    [cos_e, lin_i] = build_param_schedulers(
        [dict(type="CosineAnnealingLR"), dict(type="LinearLR", by_epoch=False)], opt, max_epochs=12, max_iters=300
    )
    assert (cos_e.end, cos_e.T_max, lin_i.end) == (12, 12, 300)


# ---------------------------------------------------------------- state


SCHEDULER_MAKERS: list[tuple[str, Callable[[Any], ParamScheduler]]] = [
    ("Constant", lambda o: ConstantLR(o, factor=0.5, end=8)),
    ("Linear", lambda o: LinearLR(o, start_factor=0.2, end=9)),
    ("Step", lambda o: StepLR(o, step_size=3, gamma=0.5)),
    ("MultiStep", lambda o: MultiStepLR(o, milestones=[3, 7], gamma=0.5)),
    ("Exponential", lambda o: ExponentialLR(o, gamma=0.9, begin=2, end=9)),
    ("Cosine", lambda o: CosineAnnealingLR(o, T_max=6, eta_min_ratio=0.05)),
    ("Poly", lambda o: PolyLR(o, power=2.0, end=10)),
    ("OneCycle", lambda o: OneCycleLR(o, eta_max=1.0, total_steps=12)),
    ("AdamMomentum", lambda o: CosineAnnealingMomentum(o, T_max=6, eta_min=0.5)),
]


@pytest.mark.parametrize("name,make", SCHEDULER_MAKERS, ids=[c[0] for c in SCHEDULER_MAKERS])
def test_state_dict_round_trip_mid_schedule(name: str, make: Callable[[Any], ParamScheduler]) -> None:
    """Resume = build fresh, load optimizer + scheduler state: the rest of the schedule is identical."""
    key = "momentum" if "Momentum" in name else "lr"
    opt = adam() if "Momentum" in name else sgd()
    sched = make(opt)
    drive(opt, sched, 5, key)
    buf = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)  # scheduler state is plain data
    uninterrupted = drive(opt, sched, 7, key)

    opt2 = adam() if "Momentum" in name else sgd()
    sched2 = make(opt2)
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    resumed = drive(opt2, sched2, 7, key)
    assert_close_seq(resumed, uninterrupted)
    assert sched2.get_last_value() == sched.get_last_value()
    if "Momentum" in name:
        assert [g["betas"][0] for g in opt2.param_groups] == [g["betas"][0] for g in opt.param_groups]


def test_last_step_resumes_without_state_dict() -> None:
    opt_ref = sgd()
    ref = drive(opt_ref, ExponentialLR(opt_ref, gamma=0.7), 8)
    opt = sgd()
    for g, lr in zip(opt.param_groups, ref[4]):
        g["initial_lr"], g["lr"] = g["lr"], lr
    sched = ExponentialLR(opt, gamma=0.7, last_step=4)
    assert sched.last_step == 5
    assert_close_seq(drive(opt, sched, 3), ref[5:])


def test_last_step_needs_initial_value() -> None:
    with pytest.raises(KeyError, match="initial_lr"):
        ExponentialLR(sgd(), gamma=0.5, last_step=3)


# ---------------------------------------------------------------- optimizer wrappers and builder


class _Wrapper:
    """Shape of the optimizer wrapper: ``param_groups`` as a property, the optimizer inside."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def step(self) -> None:
        self.optimizer.step()


def test_works_through_an_optimizer_wrapper() -> None:
    inner, ref = sgd(), sgd()
    wrapper = _Wrapper(inner)
    got = drive(wrapper, MultiStepLR(wrapper, milestones=[2, 4]), 6)
    assert_close_seq(got, drive(ref, tls.MultiStepLR(ref, [2, 4]), 6))


def test_builder_mixes_dicts_and_built_schedulers_in_order() -> None:
    opt = sgd()
    built = ExponentialLR(opt, gamma=0.5, begin=3)
    scheds = build_param_schedulers([dict(type="LinearLR", start_factor=0.5, end=3), built], opt)
    assert isinstance(scheds, list) and isinstance(scheds[0], LinearLR) and scheds[1] is built
    [single] = build_param_schedulers(dict(type="StepLR", step_size=2), sgd())
    assert isinstance(single, StepLR)


def test_builder_per_optimizer_dict() -> None:
    opts = {"generator": sgd(), "discriminator": adam()}
    out = build_param_schedulers(
        {
            "generator": [dict(type="StepLR", step_size=1, gamma=0.5)],
            "discriminator": dict(type="ExponentialLR", gamma=0.9),
        },
        opts,
    )
    assert isinstance(out, dict) and set(out) == {"generator", "discriminator"}
    for opt in opts.values():
        opt.step()
    for s in (*out["generator"], *out["discriminator"]):
        s.step()
    assert_close_seq(
        [values(opts["generator"]), values(opts["discriminator"])],
        [[b * 0.5 for b in BASE_LRS], [b * 0.9 for b in BASE_LRS]],
    )
    shared = build_param_schedulers([dict(type="StepLR", step_size=1)], opts)
    assert isinstance(shared, dict) and shared["generator"][0].optimizer is opts["generator"]
    with pytest.raises(KeyError, match="Did you mean 'generator'"):
        build_param_schedulers({"generatr": dict(type="StepLR", step_size=1)}, opts)


def test_all_schedulers_registered() -> None:
    names = [
        f"{k}{s}"
        for s in ("LR", "Momentum")
        for k in ("Constant", "Linear", "Step", "MultiStep", "Exponential", "CosineAnnealing", "Poly")
    ]
    names += [
        f"{k}ParamScheduler"
        for k in ("Constant", "Linear", "Step", "MultiStep", "Exponential", "CosineAnnealing", "Poly", "OneCycle")
    ]
    names += ["OneCycleLR"]
    for n in names:
        assert issubclass(PARAM_SCHEDULERS.get(n), ParamScheduler), n


# ---------------------------------------------------------------- errors


def test_unknown_type_suggests_close_match() -> None:
    with pytest.raises(KeyError, match="Did you mean 'CosineAnnealingLR'"):
        build_param_schedulers(dict(type="CosineAnealingLR", T_max=3), sgd())


def test_unknown_argument_suggests_close_match() -> None:
    with pytest.raises(TypeError, match=r"unknown argument.*'gama'.*Did you mean 'gamma'"):
        build_param_schedulers(dict(type="StepLR", step_size=2, gama=0.5), sgd())


def test_convert_without_epoch_length_is_explained() -> None:
    with pytest.raises(ValueError, match="epoch_length=len\\(train_dataloader\\)"):
        build_param_schedulers(dict(type="CosineAnnealingLR", T_max=3, convert_to_iter_based=True), sgd())
    with pytest.raises(ValueError, match="by_epoch=False"):
        build_param_schedulers(
            dict(type="StepLR", step_size=2, by_epoch=False, convert_to_iter_based=True), sgd(), epoch_length=4
        )


def test_cosine_without_length_is_explained() -> None:
    with pytest.raises(ValueError, match=r"T_max=\.\.\. or end=\.\.\. \(in epochs\)"):
        build_param_schedulers(dict(type="CosineAnnealingLR", by_epoch=True), sgd())
    with pytest.raises(ValueError, match="T_max"):
        build_param_schedulers(dict(type="CosineAnnealingLR", convert_to_iter_based=True), sgd(), epoch_length=10)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda o: LinearLR(o, start_factor=0.0, end=5), "start_factor must be in \\(0, 1\\]"),
        (lambda o: LinearLR(o, start_factor=0.1), "needs end="),
        (lambda o: PolyLR(o), "needs end="),
        (lambda o: OneCycleLR(o, eta_max=1.0), "total_steps=\\.\\.\\. or end="),
        (lambda o: OneCycleLR(o, eta_max=[1.0], total_steps=5), "one per group"),
        (lambda o: CosineAnnealingLR(o, T_max=3, eta_min=0.0, eta_min_ratio=0.1), "not both"),
    ],
)
def test_bad_arguments_are_explained(make: Callable[[Any], Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(sgd())


def test_non_optimizer_is_rejected() -> None:
    with pytest.raises(TypeError, match="param_groups"):
        StepLR(object(), step_size=1)  # type: ignore[arg-type]


def test_one_cycle_holds_final_value_past_total_steps() -> None:
    opt = sgd()
    s = OneCycleLR(opt, eta_max=1.0, total_steps=6)
    seq = drive(opt, s, 9)
    assert seq[7:] == [seq[6]] * 3
    assert s.end == INF


def test_schedulers_over_an_optim_wrapper_dict_are_built_per_name() -> None:
    """An OptimWrapperDict (its param_groups keyed by name) gets one scheduler list per wrapper, each moving its own
    lr."""
    from trainwright.optim import OptimWrapper, OptimWrapperDict
    from trainwright.optim.scheduler import build_param_schedulers

    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    owd = OptimWrapperDict(
        gen=OptimWrapper(torch.optim.SGD(a.parameters(), lr=1.0)),
        disc=OptimWrapper(torch.optim.SGD(b.parameters(), lr=0.5)),
    )
    built = build_param_schedulers(dict(type="MultiStepLR", milestones=[1], gamma=0.1, by_epoch=False), owd)
    assert isinstance(built, dict) and sorted(built) == ["disc", "gen"]
    for name in ("gen", "disc"):
        owd[name].optimizer.step()
        for s in built[name]:
            s.step()
    assert owd["gen"].get_lr()["lr"] == pytest.approx([0.1]) and owd["disc"].get_lr()["lr"] == pytest.approx([0.05])
