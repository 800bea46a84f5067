"""A precision is one class plus its registration: "bf16-true" (trainwright's) and "64-true" (this test directory's)
trained by a Trainer and compared with hand-written loops in the same dtype."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import LinearReg, regression_set
from float64_precision import Float64Precision, Reg, dataset, train
from launch import launch
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.amp import MixedPrecision, Precision, TruePrecision, build_precision, registered_precisions

SCRIPT = Path(__file__).with_name("float64_precision.py")


def _sgd_reference(
    model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """A hand-written loop: the model and every batch in ``dtype``, MSE loss, SGD(lr=0.05, momentum=0.9)."""
    model = copy.deepcopy(model).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in batches:
        loss = F.mse_loss(model.linear(x.to(dtype)), y.to(dtype))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_bf16_true_trains_bf16_weights_equal_to_a_hand_written_bf16_loop(tmp_path: Path) -> None:
    data = regression_set(n=20)
    model = LinearReg()
    expected = _sgd_reference(model, list(DataLoader(data, batch_size=4)), torch.bfloat16)
    trainer = tw.Trainer(
        model=model,
        work_dir=tmp_path,
        train_dataloader=DataLoader(data, batch_size=4),
        precision="bf16-true",
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=None),
        log_level="WARNING",
    )
    trainer.train()
    assert (
        isinstance(trainer.precision, TruePrecision)
        and not trainer.precision.autocasts
        and not trainer.precision.scales_loss
    )
    got = trainer.unwrapped_model.state_dict()
    assert {k: v.dtype for k, v in got.items()} == {"linear.weight": torch.bfloat16, "linear.bias": torch.bfloat16}
    for k, v in expected.items():
        assert torch.equal(got[k], v), k
    momentum = [s["momentum_buffer"] for s in trainer.optim_wrapper.optimizer.state.values()]
    assert momentum and all(m.dtype == torch.bfloat16 for m in momentum)  # optimizer state in bf16 too
    # float32 inputs go in, float32 predictions come out
    assert trainer.unwrapped_model(torch.randn(3, 4)).dtype == torch.float32
    trainer.close()


def test_bf16_true_is_registered_and_refuses_an_autocast_wrapper_beside_it(tmp_path: Path) -> None:
    assert {"32", "bf16-mixed", "16-mixed", "float8", "bf16-true"} <= set(registered_precisions())
    assert isinstance(build_precision("bf16-true"), TruePrecision)
    with pytest.raises(ValueError, match="Unknown precision 'bf16-treu'.*register_precision"):
        build_precision("bf16-treu")
    trainer = tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(regression_set(), batch_size=4),
        precision="bf16-true",
        optim_wrapper=dict(type="AmpOptimWrapper", dtype="bfloat16", optimizer=dict(type="SGD", lr=0.05)),
        log_level="WARNING",
    )
    with pytest.raises(ValueError, match="Conflicting mixed precision: Trainer\\(precision='bf16-true'\\)"):
        trainer.train()
    trainer.close()


def test_what_each_built_in_precision_answers_the_strategies_and_hooks() -> None:
    """The answers FSDP, DeepSpeed, the FLOPs hook and the logger take (they used to read dtype / scaler / name)."""
    fp32, bf16, fp16, true = (
        Precision(),
        build_precision("bf16-mixed"),
        build_precision("16-mixed"),
        build_precision("bf16-true"),
    )
    assert [p.plain for p in (fp32, bf16, fp16, true)] == [True, False, False, False]
    assert [p.scales_loss for p in (fp32, bf16, fp16, true)] == [False, False, True, False]
    assert fp32.fsdp_mixed_precision() == {} and true.fsdp_mixed_precision() == {}
    assert bf16.fsdp_mixed_precision() == {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}
    assert fp16.fsdp_mixed_precision() == {"param_dtype": torch.float16, "reduce_dtype": torch.float32}
    assert fp32.deepspeed_config() == {} and fp16.deepspeed_config() == {"fp16": {"enabled": True}}
    assert bf16.deepspeed_config() == true.deepspeed_config() == {"bf16": {"enabled": True}}
    assert [p.peak_column(torch.float32) for p in (bf16, fp16)] == ["bf16", "fp16"]
    assert true.peak_column(torch.bfloat16) == "bf16"
    assert (
        bf16.agrees_with(MixedPrecision(torch.bfloat16)) and not true.agrees_with(bf16) and not bf16.agrees_with(fp16)
    )
    # DeepSpeed scales the loss itself: the wrapper keeps float16 autocast with a disabled scaler
    engine_side = fp16.without_loss_scaling()
    assert engine_side.autocasts and engine_side.dtype == torch.float16 and not engine_side.scaler.is_enabled()
    assert bf16.without_loss_scaling() is bf16
    # FSDP: the float16 scaler becomes a ShardedGradScaler with the same settings
    fp16 = MixedPrecision(torch.float16, loss_scale=dict(init_scale=512.0, growth_interval=7))
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    sharded = fp16.sharded("cpu", ShardedGradScaler)
    assert isinstance(sharded.scaler, ShardedGradScaler)
    assert (sharded.scaler.get_scale(), sharded.scaler.get_growth_interval()) == (512.0, 7)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_precision_written_in_a_test_file_trains_under_single_and_ddp(tmp_path: Path) -> None:
    """ "64-true" (tests/amp/float64_precision.py): one process (bitwise) and 2 gloo processes (to float64 rounding)
    equal a float64 loop."""
    x, y = dataset().tensors
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 48, 8)]
    expected = _sgd_reference(Reg(), batches, torch.float64)

    trainer = train(tmp_path / "single", batch_size=8, iters=6, strategy="single")
    assert isinstance(trainer.precision, Float64Precision)
    single = trainer.unwrapped_model.state_dict()
    for k, v in expected.items():
        assert single[k].dtype == torch.float64 and torch.equal(single[k], v), k
    trainer.close()

    launch(SCRIPT, [str(tmp_path / "ddp"), "6"], tmp_path, nproc=2, timeout=120)
    for rank in range(2):
        result = torch.load(tmp_path / "ddp" / f"result_rank{rank}.pt", weights_only=True)
        assert (result["precision"], result["strategy"], result["world_size"]) == ("64-true", "ddp", 2)
        for k, v in expected.items():  # 2 ranks x 4 samples, gradients averaged: the 8-sample batch's mean gradient
            assert result["params"][k].dtype == torch.float64
            torch.testing.assert_close(result["params"][k], v, rtol=0, atol=1e-12)


assert sys.modules["float64_precision"].Float64Precision is Float64Precision
