"""2-D parallelism (FSDP over dp x tensor parallel over tp) on real gloo processes against one process.

Two process starts run every training the multi-process tests compare (see tp_train.py):
4 processes run examples/char_gpt.py's model (tiny) as a 2x2 (dp, tp) mesh with checkpoints,
resume its checkpoint as 4x1, load its gathered weights into another 2x2 run, train and resume it with each Block
compiled
(``compile=dict(regions=["Block"])``, backend aot_eager: dynamo and AOTAutograd over FSDP2 and DTensor without C++ code
generation, which four processes on this machine's two cores would take a minute for), and hit the two start-up errors;
one process runs the
full-batch reference and resumes the 2x2 checkpoint as 1x1 (FSDP without a launcher, and
strategy='single' through load_full). Tolerances, float32: losses within 1e-5 relative,
parameters within 1e-6 + 1e-5 relative after 6 SGD-momentum steps with clipping (measured: ~1e-7).
The plan-syntax tests at the end run in the test process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from launch import launch
from torch import nn

SCRIPT = Path(__file__).with_name("tp_train.py")
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tp")
    ckpt = out / "T" / "checkpoints" / "iter_3.dcp"
    # 4 processes: 2x2 with checkpoints at 3 and 6; its iteration-3 checkpoint resumed as 4x1 (tensor_parallel size 1,
    # plan kept);
    # its gathered weights loaded (load_from) into a 2x2 run that does not move them (lr=0);
    # a callable plan; a plan pattern that matches nothing; tensor_parallel size 3 (does not divide 4)
    # the 2x2 run with each Block compiled (checkpoint at 3) and its resume from iteration 3
    # (no validation: the tests compare their training only, and validating would compile the inference graphs too)
    compiled = [
        "K:tp2:8:6:save=3:compile=aot_eager:val=0",
        f"R:tp2:8:6:compile=aot_eager:val=0:resume={out / 'K' / 'checkpoints' / 'iter_3.dcp'}",
    ]
    launch(
        SCRIPT,
        [
            str(out),
            "T:tp2:8:6:save=3:weights=1:ema=1",
            f"U:tp1:4:6:resume={ckpt}:ema=1",
            f"L:tp2:8:1:lr=0:load={out / 'T' / 'weights.safetensors'}",
            "C:tp2:8:2:plan=callable",
            "B:tp2:8:1:plan=bad",
            "X:tp3:8:1",
            *compiled,
            "V:tp2:8:3:unseeded=1",
        ],
        out,
        nproc=4,
        timeout=480,
    )
    # 1 process: the full-batch reference; the 2x2 checkpoint resumed as a 1-process FSDP run and by strategy='single'
    launch(
        SCRIPT,
        [
            str(out),
            "F:single:16:6:ema=1",
            f"O:fsdp:16:6:resume={ckpt}:ema=1",
            f"S:single:16:6:resume={ckpt}:ema=1",
            "W:single:16:3:unseeded=1",
        ],
        out,
        nproc=1,
        timeout=240,
    )
    return out


def _result(out: Path, name: str, rank: int = 0) -> dict:
    return torch.load(out / name / f"result_rank{rank}.pt", weights_only=False)


def _losses(r: dict) -> list[float]:
    return [rec["loss"] for rec in r["train"]]


def _assert_params_close(a: dict, b: dict) -> None:
    assert a["params"].keys() == b["params"].keys()
    for k, v in b["params"].items():
        torch.testing.assert_close(a["params"][k], v, atol=ATOL, rtol=RTOL, msg=k)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_2x2_mesh_trains_as_one_process_on_the_full_batch(out: Path) -> None:
    """4 ranks as (dp=2, tp=2), 8 samples per data shard == 1 process x 16: every logged loss, the clipped global norm,
    the
    weights, the validation loss (10 sequences over 2 data shards); each tp pair shares a data shard; throughput
    counts 2 x 8."""
    name = "T"
    tp, single = _result(out, name), _result(out, "F")
    assert tp["error"] is None and (tp["world_size"], tp["data_parallel_size"]) == (4, 2)
    assert [_result(out, name, r)["data_parallel_rank"] for r in range(4)] == [0, 0, 1, 1]
    assert len(_losses(tp)) == 6 and _losses(single)[-1] < _losses(single)[0]
    torch.testing.assert_close(_losses(tp), _losses(single), rtol=RTOL, atol=0)
    assert single["train"][0]["grad_norm"] > 0.5  # clipping (max_norm 0.5) did act
    torch.testing.assert_close(
        [r["grad_norm"] for r in tp["train"]], [r["grad_norm"] for r in single["train"]], rtol=RTOL, atol=0
    )
    for rank in range(4):  # the norm over both mesh dimensions, the same on every rank
        assert _result(out, name, rank)["grad_norm"] == pytest.approx(single["grad_norm"], rel=RTOL)
    _assert_params_close(tp, single)
    assert tp["val"][0]["val/loss"] == pytest.approx(single["val"][0]["val/loss"], rel=RTOL)
    for rec in tp["train"]:  # samples per step: 2 data shards x 8, not 4 processes x 8
        assert rec["samples_per_s"] * rec["time"] == pytest.approx(16, rel=1e-6)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_ranks_that_drew_different_initial_weights_train_rank_0s(out: Path) -> None:
    """Each of the 4 processes built the model from its own draw (a script that does not seed): the 2x2 run trains rank
    0's
    initial weights, equal to one process with batch 16 from that draw (before, the tp replicas held different
    weights)."""
    _assert_params_close(_result(out, "V"), _result(out, "W"))
    torch.testing.assert_close(_losses(_result(out, "V")), _losses(_result(out, "W")), rtol=RTOL, atol=0)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_later_trainers_of_one_layout_reuse_the_mesh_and_its_process_groups(out: Path) -> None:
    """Six 2x2 Trainers (and a 4x1 one) ran one after another in each process: the process holds as many process groups
    after
    the last as after the first (a new mesh per Trainer would add its dp and tp groups each time, kept until the
    process exits)."""
    first = _result(out, "T")
    assert first["groups"] >= 3  # the default group and the mesh's dp and tp groups
    for rank in range(4):
        assert _result(out, "R", rank)["groups"] == _result(out, "T", rank)["groups"] == first["groups"], rank


@pytest.mark.multiprocess
@pytest.mark.slow
def test_2x2_checkpoint_resumes_at_4x1_and_1x1(out: Path) -> None:
    """Steps 1-3 at 2x2, 4-6 at 4x1 (tensor_parallel size 1), at 1x1 as FSDP, and on one device without a process group:
    the losses of steps 4-6, the final weights and the EMAHook's average equal the uninterrupted runs (2x2 and the
    one-process reference)."""
    single, uninterrupted = _result(out, "F"), _result(out, "T")
    assert sorted(p.name for p in (out / "T" / "checkpoints" / "iter_3.dcp").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "__2_0.distcp",
        "__3_0.distcp",
        "trainer_state.pth",
    ]
    assert single["ema"].keys() == single["params"].keys()
    for name, dp in (("U", 4), ("O", 1), ("S", 1)):
        resumed = _result(out, name)
        assert (resumed["error"], resumed["iteration"], resumed["data_parallel_size"]) == (None, 6, dp), name
        torch.testing.assert_close(_losses(resumed), _losses(single)[3:], rtol=RTOL, atol=0, msg=name)
        _assert_params_close(resumed, uninterrupted)
        _assert_params_close(resumed, single)
        for k, v in single[
            "ema"
        ].items():  # the EMA of the sharded blocks: averaged per shard at 2x2, resharded by the checkpoint
            torch.testing.assert_close(resumed["ema"][k], v, atol=ATOL, rtol=RTOL, msg=f"{name} ema {k}")
            torch.testing.assert_close(uninterrupted["ema"][k], v, atol=ATOL, rtol=RTOL, msg=f"T ema {k}")
        assert resumed["val"][0]["val/loss"] == pytest.approx(single["val"][0]["val/loss"], rel=RTOL)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_2x2_with_compiled_blocks_trains_as_eager_and_resumes_exactly(out: Path) -> None:
    """Each Block compiled before FSDP shards it, on the 2x2 mesh: the losses and weights of the eager 2x2 run (within
    the
    tolerances; measured equal), and a resume from its iteration-3 checkpoint ends with its weights bitwise."""
    eager, compiled, resumed = _result(out, "T"), _result(out, "K"), _result(out, "R")
    assert (compiled["error"], resumed["error"]) == (None, None)
    assert compiled["graphs"] > 0 and resumed["graphs"] > 0  # the blocks did run as compiled graphs
    torch.testing.assert_close(_losses(compiled), _losses(eager), rtol=RTOL, atol=0)
    _assert_params_close(compiled, eager)
    assert _losses(resumed) == _losses(compiled)[3:]
    for k, v in compiled["params"].items():
        assert torch.equal(resumed["params"][k], v), k


@pytest.mark.multiprocess
@pytest.mark.slow
def test_full_weights_gathered_from_2x2_and_loaded_into_2x2(out: Path) -> None:
    """save_weights of the 2x2 run holds the full weights (equal to the one-process run's), and load_from= that file on
    a 2x2 mesh
    (one step at lr=0) gives every rank its slices back: the gathered model equals the file exactly."""
    from safetensors.torch import load_file

    saved, single = load_file(out / "T" / "weights.safetensors"), _result(out, "F")
    assert saved.keys() == single["params"].keys() and saved["blocks.0.mlp.fc1.weight"].shape == (
        64,
        16,
    )  # whole, not a shard
    _assert_params_close({"params": saved}, single)
    loaded = _result(out, "L")
    assert loaded["error"] is None
    for k, v in saved.items():
        assert torch.equal(loaded["params"][k], v), k


@pytest.mark.multiprocess
@pytest.mark.slow
def test_callable_plan_gets_the_tp_mesh(out: Path) -> None:
    """plan=callable(model, mesh), splitting only the first block's MLP: the same losses as the reference."""
    r = _result(out, "C")
    assert r["error"] is None
    torch.testing.assert_close(_losses(r), _losses(_result(out, "F"))[:2], rtol=RTOL, atol=0)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_pattern_that_matches_nothing_is_an_error_naming_it_and_the_paths(out: Path) -> None:
    for rank in range(4):
        error = _result(out, "B", rank)["error"]
        assert error is not None and "'blocks.*.attn.qkv' matches no module of CharGPT" in error, error
        assert "'blocks.0.attn.q'" in error and "'*' stands for exactly one" in error


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_world_size_the_tp_size_does_not_divide_fails_at_start(out: Path) -> None:
    for rank in range(4):
        r = _result(out, "X", rank)
        assert (
            "tensor_parallel size 3 does not divide the world size 4" in r["error"] and "one of [1, 2, 4]" in r["error"]
        ), r["error"]
        assert "world_size" not in r  # the Trainer was never built


# -- in the test process -------------------------------------------------------------------------


def test_one_process_cannot_hold_a_tensor_parallel_group(tmp_path: Path) -> None:
    """No launcher, tensor_parallel size 2 (or diff_rank_seed with tensor parallelism): refused while the Trainer is
    built, before any process group is made."""
    import torch.distributed as dist

    import trainwright as tw

    with pytest.raises(ValueError, match=r"tensor_parallel size 2 does not divide the world size 1.*one of \[1\]"):
        tw.Trainer(
            model=nn.Linear(2, 2),
            work_dir=tmp_path,
            strategy=dict(type="fsdp", tensor_parallel=dict(size=2, plan={"weight": "colwise"})),
        )
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="diff_rank_seed=True cannot be used with tensor_parallel"):
        tw.Trainer(
            model=nn.Linear(2, 2),
            work_dir=tmp_path,
            strategy=dict(type="fsdp", tensor_parallel=dict(size=2, plan={"weight": "colwise"})),
            randomness=dict(seed=0, diff_rank_seed=True),
        )
    assert not dist.is_initialized()


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.ModuleDict({"fc1": nn.Linear(2, 2), "fc2": nn.Linear(2, 2), "norm": nn.LayerNorm(2)}) for _ in range(2)]
        )
        self.deep = nn.ModuleDict({"x": nn.ModuleDict({"fc1": nn.Linear(2, 2)})})


def test_plan_patterns_match_one_path_component_per_star() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    from trainwright.strategies.tensor_parallel import resolve_plan

    plan = resolve_plan(
        _Net(), {"blocks.*.fc1": "colwise", "blocks.*.fc2": RowwiseParallel(), "blocks.?.norm": "sequence"}
    )
    assert sorted(plan) == [
        "blocks.0.fc1",
        "blocks.0.fc2",
        "blocks.0.norm",
        "blocks.1.fc1",
        "blocks.1.fc2",
        "blocks.1.norm",
    ]  # not deep.x.fc1
    assert (
        type(plan["blocks.1.fc1"]) is ColwiseParallel
        and type(plan["blocks.0.fc2"]) is RowwiseParallel
        and type(plan["blocks.0.norm"]) is SequenceParallel
    )
    assert sorted(resolve_plan(_Net(), {"*.*.fc1": "colwise"})) == ["blocks.0.fc1", "blocks.1.fc1", "deep.x.fc1"]
    with pytest.raises(
        ValueError, match=r"'\*.fc1' matches no module of _Net\. Module paths that exist include \[.*'blocks.0.fc1'"
    ):
        resolve_plan(_Net(), {"*.fc1": "colwise"})
    with pytest.raises(ValueError, match=r"'blocks.\*.fc1' and 'blocks.0.\*' both match module 'blocks.0.fc1'"):
        resolve_plan(_Net(), {"blocks.*.fc1": "colwise", "blocks.0.*": "rowwise"})


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (dict(size=2), "needs a plan"),
        (dict(size=0, plan={}), "positive int"),
        (
            dict(size=2, plan={"blocks.*.fc1": "column"}),
            r"'column' is not a style: use one of \['colwise', 'rowwise', 'sequence'\]",
        ),
        (dict(sizes=2), "Did you mean 'size'"),
    ],
)
def test_bad_tensor_parallel_configs_are_refused_when_the_strategy_is_built(cfg: dict, message: str) -> None:
    from trainwright.registry import ConfigError
    from trainwright.strategies import build_strategy

    with pytest.raises(ConfigError, match=message):
        build_strategy(dict(type="fsdp", tensor_parallel=cfg))
