"""strategy='deepspeed': ZeRO-2 trains the digits example on 2 gloo processes (when DeepSpeed is installed); a clear
error when it is not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from launch import launch

import trainwright as tw

SCRIPT = Path(__file__).with_name("ds_train.py")


def test_missing_deepspeed_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without DeepSpeed, strategy='deepspeed' fails at once, naming the extra to install and the built-in
    alternatives."""
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # what importlib sees when the package is absent
    with pytest.raises(ImportError, match=r"pip install 'trainwright\[deepspeed\]'.*strategy='fsdp'"):
        tw.Trainer(model=torch.nn.Linear(2, 1), work_dir=tmp_path, strategy="deepspeed")


def test_zero3_is_refused_with_the_alternative() -> None:
    pytest.importorskip("deepspeed")
    from trainwright.strategies import build_strategy

    with pytest.raises(ValueError, match="strategy='fsdp'"):
        build_strategy(dict(type="deepspeed", config=dict(zero_optimization=dict(stage=3))))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_zero2_trains_digits_on_two_processes_and_resumes_exactly(tmp_path: Path) -> None:
    """ZeRO-2 (optimizer state and gradients partitioned): 3 epochs reach 90% on the digits, both ranks hold the same
    weights;
    2 epochs + a resumed 3rd (the engine's checkpoint directory) == 3 epochs, bit for bit."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("sklearn")
    launch(SCRIPT, [str(tmp_path)], tmp_path, nproc=2, timeout=300)
    r0, r1 = (torch.load(tmp_path / "full" / f"result_rank{r}.pt", weights_only=True) for r in (0, 1))
    assert (r0["strategy"], r0["optimizer"]) == ("deepspeed", "DeepSpeedZeroOptimizer")
    assert r0["wrapper_untouched"] and r1["wrapper_untouched"]
    assert r0["metrics"]["val/acc"] >= 0.9 and r0["metrics"] == r1["metrics"]
    for k, v in r0["params"].items():
        assert torch.equal(v, r1["params"][k]), k
    resumed = torch.load(tmp_path / "split" / "result_rank0.pt", weights_only=True)
    assert resumed["iteration"] == r0["iteration"]
    for k, v in r0["params"].items():
        assert torch.equal(v, resumed["params"][k]), k
    ckpts = tmp_path / "full" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "epoch_3.ds",
        "latest",
    ]  # max_keep_ckpts=1 removed the older directories
    assert sorted(p.name for p in (ckpts / "epoch_3.ds" / "state").glob("zero_pp_rank_*_optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "full" / "weights.safetensors")
    assert weights.keys() == r0["params"].keys() and all(torch.equal(weights[k], v) for k, v in r0["params"].items())


@pytest.mark.multiprocess
@pytest.mark.slow
def test_zero2_with_accumulation_and_clipping_equals_ddp(tmp_path: Path) -> None:
    """The optim wrapper decides the windows (the engine is told each boundary, the loss comes scaled): ZeRO-2 with
    accumulative_counts=2 and clipping ends with DDP's weights; and the default config with momentum and no clip_grad
    (2 processes x 8) ends with DDP's too (DDP 2x8 equals one process on the full batch: tests/strategies/test_ddp*)."""
    pytest.importorskip("deepspeed")
    launch(Path(__file__).with_name("ds_accum_train.py"), [str(tmp_path)], tmp_path, nproc=2, timeout=300)
    w = torch.load(tmp_path / "weights.pt", weights_only=True)
    for k, v in w["ddp"].items():
        torch.testing.assert_close(w["deepspeed"][k], v, rtol=1e-6, atol=1e-7)
    # the default config without clip_grad: no clipping (DeepSpeed's own default clips at 1.0, which made 2x8 drift from
    # DDP)
    from ds_accum_train import run

    single = run(
        dict(type="single", device="cpu"), tmp_path / "single", plain=True, batch=16
    )  # 1 x 16: the same samples per step
    for k, v in single.items():  # 2 x 8 under DeepSpeed and under DDP equal 1 x 16 on one process
        torch.testing.assert_close(w["ddp_plain"][k], v, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(w["deepspeed_plain"][k], v, rtol=1e-5, atol=1e-6)
