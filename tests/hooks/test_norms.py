"""NormsHook: per-group grad / param norms and update ratios equal torch's norms in a hand-written loop, in the
records only when due."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.hooks import NormsHook


class Blocks(tw.BaseModel):
    """``blocks.0`` / ``blocks.1`` (each a Linear inside a Sequential), ``head``, and a parameter of the model
    itself."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(4, 6), nn.Tanh()), nn.Sequential(nn.Linear(6, 6), nn.Tanh())]
        )
        self.head = nn.Linear(6, 1)
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        for b in self.blocks:
            x = b(x)
        out = self.head(x) * self.scale
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True).sin())


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["mode"] == "train"]


def _group(name: str, per: str) -> str:
    if per == "global":
        return "global"
    if per == "param":
        return name
    parts = name.split(".")[:-1]
    return ".".join(parts[:2]) if parts else name


def _reference(
    model: nn.Module, data: TensorDataset, *, acc: int, clip: float | None, due: set[int], per: str
) -> dict[int, dict[str, float]]:
    """A hand-written loop (SGD with momentum, batches of 2 in order): torch's norms at the steps closing the due
    iterations' windows."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    n = len(data) // 2
    out: dict[int, dict[str, float]] = {}
    pending = False
    for it in range(1, n + 1):
        x, y = data.tensors[0][2 * it - 2 : 2 * it], data.tensors[1][2 * it - 2 : 2 * it]
        (F.mse_loss(model(x), y) / acc).backward()
        pending = pending or it in due
        if it % acc and it != n:
            continue
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if pending:
            named = dict(model.named_parameters())
            before = {k: p.detach().clone() for k, p in named.items()}
            grads = {k: p.grad.detach().clone() for k, p in named.items()}
        opt.step()
        if pending:
            values: dict[str, float] = {}
            for g in {_group(k, per) for k in named}:
                keys = [k for k in named if _group(k, per) == g]
                gn = torch.cat([grads[k].flatten() for k in keys]).norm()
                pn = torch.cat([before[k].flatten() for k in keys]).norm()
                un = torch.cat([(named[k].detach() - before[k]).flatten() for k in keys]).norm()
                values.update(
                    {f"grad_norm/{g}": gn.item(), f"param_norm/{g}": pn.item(), f"update_ratio/{g}": (un / pn).item()}
                )
            out[it] = values
            pending = False
        opt.zero_grad()
    return out


@pytest.mark.parametrize(
    ("acc", "clip", "per"), [(1, None, "module"), (2, 0.05, "module"), (1, None, "param"), (2, None, "global")]
)
def test_logged_norms_equal_a_hand_computation(tmp_path: Path, acc: int, clip: float | None, per: str) -> None:
    model = Blocks()
    ref = copy.deepcopy(model)
    data = _data()
    optim: dict[str, Any] = dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9), accumulative_counts=acc)
    if clip is not None:
        optim["clip_grad"] = dict(max_norm=clip)
    trainer = tw.Trainer(
        model=model,
        work_dir=tmp_path,
        train_dataloader=DataLoader(data, batch_size=2),
        optim_wrapper=optim,
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=None, logger=dict(interval=1), norms=dict(interval=3, per=per)),
        log_level="WARNING",
        randomness=dict(seed=0),
    )
    trainer.train()
    trainer.close()
    expected = _reference(ref, data, acc=acc, clip=clip, due={3, 6, 9}, per=per)
    # without accumulation the due iterations step; with windows of 2 the steps closing them are 4, 6 and 10
    assert sorted(expected) == ([3, 6, 9] if acc == 1 else [4, 6, 10])
    records = {r["iter"]: r for r in _records(trainer.run_dir)}
    assert sorted(records) == list(range(1, 11))
    for it, rec in records.items():
        logged = {
            k: v for k, v in rec.items() if "/" in k and k.split("/")[0] in ("grad_norm", "param_norm", "update_ratio")
        }
        if it not in expected:
            assert logged == {}, f"iteration {it} is not a measured step but its record has {sorted(logged)}"
            continue
        assert sorted(logged) == sorted(expected[it])
        for k, v in expected[it].items():
            assert logged[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    if per == "module":
        assert {k.split("/", 1)[1] for k in expected[sorted(expected)[0]]} == {"blocks.0", "blocks.1", "head", "scale"}
    if clip is not None:  # the measured gradients are the clipped ones
        assert all(
            v <= clip * (1 + 1e-5) for r in expected.values() for k, v in r.items() if k.startswith("grad_norm/")
        )


class TinyGAN(tw.BaseModel):
    """Two optimizers, one step each per batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.generator = nn.Linear(3, 2)
        self.discriminator = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))

    def forward(self, *inputs: Any, mode: str = "tensor") -> Any:
        return self.generator(inputs[0])

    def train_step(self, data: Any, optim_wrapper: Any) -> dict[str, torch.Tensor]:
        z, real = self.data_preprocessor(data, True)
        optim_wrapper["discriminator"].zero_grad()
        loss_d = (
            F.softplus(-self.discriminator(real)).mean()
            + F.softplus(self.discriminator(self.generator(z).detach())).mean()
        )
        optim_wrapper["discriminator"].update_params(loss_d)
        loss_g = F.softplus(-self.discriminator(self.generator(z))).mean()
        optim_wrapper["generator"].update_params(loss_g)
        return {"loss_d": loss_d.detach(), "loss_g": loss_g.detach()}


def test_several_optimizers_each_measured_at_its_own_step(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(9)
    ds = TensorDataset(torch.randn(16, 3, generator=g), torch.randn(16, 2, generator=g) + 2.0)
    model = TinyGAN()
    ref = copy.deepcopy(model)
    trainer = tw.Trainer(
        model=model,
        work_dir=tmp_path,
        train_dataloader=DataLoader(ds, batch_size=4),
        optim_wrapper=dict(
            generator=dict(optimizer=dict(type="SGD", lr=0.1)), discriminator=dict(optimizer=dict(type="SGD", lr=0.05))
        ),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=None, logger=dict(interval=1), norms=dict(interval=2, per="global")),
        log_level="WARNING",
        randomness=dict(seed=0),
    )
    trainer.train()
    trainer.close()
    opt_g, opt_d = (
        torch.optim.SGD(ref.generator.parameters(), lr=0.1),
        torch.optim.SGD(ref.discriminator.parameters(), lr=0.05),
    )
    expected: dict[int, dict[str, float]] = {}
    for it in range(1, 5):
        z, real = ds.tensors[0][4 * it - 4 : 4 * it], ds.tensors[1][4 * it - 4 : 4 * it]
        opt_d.zero_grad()
        (
            F.softplus(-ref.discriminator(real)).mean()
            + F.softplus(ref.discriminator(ref.generator(z).detach())).mean()
        ).backward()
        d_grad = torch.cat([p.grad.flatten() for p in ref.discriminator.parameters()]).norm().item()
        opt_d.step()
        opt_d.zero_grad()
        F.softplus(-ref.discriminator(ref.generator(z))).mean().backward()
        g_grad = torch.cat([p.grad.flatten() for p in ref.generator.parameters()]).norm().item()
        g_param = torch.cat([p.detach().flatten() for p in ref.generator.parameters()]).norm().item()
        opt_g.step()
        opt_g.zero_grad()
        expected[it] = {
            "grad_norm/discriminator": d_grad,
            "grad_norm/generator": g_grad,
            "param_norm/generator": g_param,
        }
    records = {r["iter"]: r for r in _records(trainer.run_dir)}
    for it in (1, 3):
        assert not any(k.startswith("grad_norm/") for k in records[it])
    for it in (2, 4):
        for k, v in expected[it].items():
            assert records[it][k] == pytest.approx(v, rel=1e-5), (it, k)
        assert "update_ratio/discriminator" in records[it] and "update_ratio/generator" in records[it]


def test_off_by_default_and_on_by_name(tmp_path: Path) -> None:
    from trainwright.trainer.hooks_config import build_hooks

    assert not any(isinstance(h, NormsHook) for h in build_hooks(None, None))
    hooks = [h for h in build_hooks(dict(norms=dict(interval=7, per="param")), None) if isinstance(h, NormsHook)]
    assert len(hooks) == 1 and (hooks[0].interval, hooks[0].per) == (7, "param")
    assert any(isinstance(h, NormsHook) for h in build_hooks(dict(norms=dict()), None))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(per="layer"), "per must be one of"),
        (dict(interval=0), "interval must be an int >= 1"),
        (dict(depth=0), "depth must be an int >= 1"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        NormsHook(**kwargs)


class _StepWatch(tw.Hook):
    """Records, at every training iteration, what the optimizer's ``step`` is once every other hook has prepared it."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def before_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None) -> None:
        self.seen.append(vars(trainer.optim_wrapper.optimizer).get("step"))


def test_the_optimizer_step_stays_its_own(tmp_path: Path) -> None:
    """At a measured step the optimizer's ``step`` is its class's own (torch's step hooks measure it), and the
    numbers equal the hand computation."""
    model = Blocks()
    ref = copy.deepcopy(model)
    watch = _StepWatch()
    trainer = tw.Trainer(
        model=model,
        work_dir=tmp_path,
        train_dataloader=DataLoader(_data(), batch_size=2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=4),
        default_hooks=dict(checkpoint=None, logger=dict(interval=1), norms=dict(interval=2)),
        custom_hooks=[watch],
        log_level="WARNING",
        randomness=dict(seed=0),
    )
    trainer.train()
    trainer.close()
    optimizer = trainer.optim_wrapper.optimizer
    assert watch.seen == [None] * 4  # no instance attribute shadows the class's step, due iterations (2, 4) included
    assert type(optimizer).step.__get__(optimizer) == optimizer.step
    expected = _reference(ref, _data(), acc=1, clip=None, due={2, 4, 6, 8, 10}, per="module")
    records = {r["iter"]: r for r in _records(trainer.run_dir)}
    for it in (2, 4):
        for k, v in expected[it].items():
            assert records[it][k] == pytest.approx(v, rel=1e-5, abs=1e-7), (it, k)
    assert not any(k.startswith("grad_norm/") for k in records[3])


def test_compiled_step_is_measured_without_compiling_it_again(tmp_path: Path) -> None:
    """With ``OptimWrapper(compile=...)`` the numbers equal the eager run's and the step compiles as often as without
    the hook (step hooks would recompile it per measured step)."""
    from torch._dynamo.utils import counters

    watch = _StepWatch()

    def run(compiled: bool, norms: bool) -> tuple[dict[int, dict[str, float]], int]:
        watch.seen.clear()
        torch._dynamo.reset()
        counters.clear()
        optim: dict[str, Any] = dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9))
        if compiled:
            optim["compile"] = dict(backend="eager")  # dynamo only: no C++ compiler needed
        t = tw.Trainer(
            model=Blocks(),
            work_dir=tmp_path / f"{compiled}{norms}",
            train_dataloader=DataLoader(_data(), batch_size=2),
            optim_wrapper=optim,
            train_cfg=dict(by_epoch=False, max_iters=20),
            log_level="WARNING",
            randomness=dict(seed=0),
            default_hooks=dict(checkpoint=None, logger=dict(interval=2), norms=dict(interval=2) if norms else None),
            custom_hooks=[watch],
        )
        t.train()
        t.close()
        # the optimizer's step is what the optim wrapper made it (its compiled step, or the class's own) at every
        # iteration, measured ones included
        assert watch.seen == [t.optim_wrapper.compiled_step] * 20
        graphs = counters["stats"]["unique_graphs"]
        torch._dynamo.reset()
        return {
            r["iter"]: {k: v for k, v in r.items() if k.startswith(("grad_norm/", "update_ratio/"))}
            for r in _records(t.run_dir)
        }, graphs

    eager, _ = run(False, True)
    measured, graphs = run(True, True)
    _, graphs_without_hook = run(True, False)
    assert sorted(measured) == sorted(eager) == list(range(2, 21, 2))
    for i in eager:
        assert len(measured[i]) == 8
        assert measured[i] == pytest.approx(eager[i], rel=1e-4), (
            i
        )  # the compiled step rounds differently; drift over 20 steps
    assert graphs == graphs_without_hook, (graphs, graphs_without_hook)
