"""Regional compilation (``compile=dict(regions=["Block"])``): eager losses, exact resume, and the CUDA-graph checks.

A 2-block model (ac_train.Net) trains 4 SGD-momentum steps eager and with each ``Block``
compiled in place; losses and weights agree within 1e-5 (inductor fuses the block's
arithmetic differently; measured ~1e-7). Resuming a compiled run half-way gives the
uninterrupted compiled run's weights bitwise (same kernels, same data order). torch.compile
on CPU needs a C++ compiler; the module shares one inductor cache folder (in its own
temporary folder), so later tests reuse the first compile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ac_train import Net, data
from conftest import NEEDS_COMPILER
from torch import nn
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.model.compile import apply_compile

pytestmark = NEEDS_COMPILER
TOL = 1e-5


#: Whether each Block call ran inside compiled code (a forward pre-hook records it: a hook is part of the compiled
#: call).
COMPILED_CALLS: list[bool] = []


def _record(module: nn.Module, args: Any) -> None:
    COMPILED_CALLS.append(torch.compiler.is_compiling())


def _net(record: bool = True) -> Net:
    tw.seed_everything(0)
    net = Net(dim=8, depth=2)
    for block in net.blocks:
        if record:
            block.register_forward_pre_hook(_record)
    return net


def _trainer(
    work_dir: Path, iters: int, compile: Any = False, resume: bool = False, save: int = -1, **kwargs: Any
) -> tw.Trainer:
    tw.seed_everything(0)
    return tw.Trainer(
        model=_net(),
        work_dir=work_dir,
        train_dataloader=dict(dataset=data(), batch_size=8, shuffle=True, drop_last=True),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        default_hooks=dict(checkpoint=dict(by_epoch=False, interval=save), logger=dict(interval=1)),
        compile=compile,
        resume=resume,
        randomness=dict(seed=0),
        log_level="WARNING",
        **kwargs,
    )


def _train(trainer: tw.Trainer) -> dict[str, torch.Tensor]:
    trainer.train()
    state = {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    trainer.close()
    return state


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float) -> None:
    assert a.keys() == b.keys()  # compiling in place keeps the keys (no _orig_mod.)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=tol, rtol=0, msg=k)


class _LossHook(tw.Hook):
    priority = "LOWEST"

    def __init__(self) -> None:
        self.losses: list[float] = []

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        self.losses.append(outputs["loss"].item())


@pytest.mark.parametrize("ac", [False, True], ids=["regions", "regions_with_activation_checkpointing"])
def test_regional_compile_trains_as_eager(tmp_path: Path, ac: bool) -> None:
    extra = dict(activation_checkpointing=["Block"]) if ac else {}
    records: dict[str, list[float]] = {}
    states = {}
    for name, compile in (("eager", False), ("compiled", dict(regions=["Block"]))):
        COMPILED_CALLS.clear()
        hook = _LossHook()
        states[name] = _train(_trainer(tmp_path / name, 4, compile=compile, custom_hooks=[hook], **extra))
        records[name] = hook.losses
        calls = list(COMPILED_CALLS)
        blocks = 2  # the model's depth (_trainer)
        if (
            name == "compiled"
        ):  # the first iteration runs eagerly (the FlopsHook counts it), every later block call compiled
            assert not any(calls[:blocks]) and all(calls[blocks:]) and len(calls) > blocks, calls
        else:
            assert calls and not any(calls), calls
    assert records["compiled"] == pytest.approx(records["eager"], abs=TOL)
    _assert_close(states["compiled"], states["eager"], TOL)


def test_exact_resume_with_regional_compile(tmp_path: Path) -> None:
    compile = dict(regions=["Block"])
    whole = _train(_trainer(tmp_path / "whole", 6, compile=compile))
    _train(_trainer(tmp_path / "split", 3, compile=compile, save=3))
    resumed = _trainer(tmp_path / "split", 6, compile=compile, resume=True)
    split = _train(resumed)
    assert resumed.progress.iteration == 6
    _assert_close(split, whole, 0.0)  # bitwise: the same compiled kernels on the same batches


def test_a_region_that_matches_nothing_is_an_error_naming_the_model_classes() -> None:
    with pytest.raises(
        ValueError,
        match=r"compile regions: 'Blocks' matches no module of Net; name one of its module classes \[.*'Block'",
    ):
        apply_compile(Net(), dict(regions=["Blocks"]))
    with pytest.raises(ValueError, match=r"Unknown compile key 'modes'"):
        apply_compile(Net(), dict(regions=["Block"], modes="max-autotune"))


def test_cuda_graph_mode_checks_at_start(tmp_path: Path) -> None:
    cudagraphs = dict(regions=["Block"], mode="reduce-overhead")
    ds = data(30)  # 30 samples, batch 8: the last batch holds 6
    trainer = tw.Trainer(
        model=Net(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(ds, batch_size=8),
        compile=cudagraphs,
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=2),
        log_level="WARNING",
    )
    with pytest.raises(
        ValueError,
        match=r"records CUDA graphs for fixed shapes.*last batch holds 6 samples instead of 8.*drop_last=True",
    ):
        trainer.train()
    trainer.close()
    if not torch.cuda.is_available():
        with pytest.warns(
            UserWarning,
            match=r"mode='reduce-overhead' records CUDA graphs, which need a CUDA device; the model is on 'cpu'",
        ):
            apply_compile(Net(), cudagraphs)


@pytest.mark.cuda
def test_cuda_regional_reduce_overhead_with_compiled_optimizer_trains_as_eager(tmp_path: Path) -> None:
    def run(name: str, compile: Any, compile_step: bool) -> dict[str, torch.Tensor]:
        tw.seed_everything(0)
        trainer = tw.Trainer(
            # no recording hook: on an H200 (torch 2.11) it was compiled as a frame of its own, once per block and mode,
            # until dynamo's recompile limit, which fullgraph=True turns into an error
            model=_net(record=False),
            work_dir=tmp_path / name,
            train_dataloader=dict(dataset=data(64), batch_size=8, shuffle=True, drop_last=True),
            optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-2), compile=compile_step),
            train_cfg=dict(by_epoch=False, max_iters=12),
            param_scheduler=dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=6),
            default_hooks=dict(checkpoint=None, logger=dict(interval=2)),
            compile=compile,
            strategy=dict(type="single", device="cuda"),
            randomness=dict(seed=0),
            log_level="WARNING",
        )
        return {k: v.cpu() for k, v in _train(trainer).items()}

    eager = run("eager", False, False)
    graphs = run("graphs", dict(regions=["Block"], mode="reduce-overhead"), True)
    _assert_close(graphs, eager, 1e-4)
