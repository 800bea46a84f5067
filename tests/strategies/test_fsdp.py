"""FSDP2 on real gloo processes against one process: parity, accumulation, clipping, sharded checkpoints across world
sizes, save_weights.

Also the features users combine with a multi-process strategy (DDP runs share the launch): early stopping, best
checkpoints
and publishing under FSDP, EMA validation under DDP, a non-finite loss on one rank (raised, or skipped), preemption and
the profiler under FSDP.

Three process starts (one torchrun, two single processes) run every training the tests
compare (see fsdp_train.py); each test asserts one behaviour. Tolerance: parameters within
1e-6 after 8 SGD-momentum steps (the sharded runs reduce in another order; measured ~6e-8).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from launch import launch

SCRIPT = Path(__file__).with_name("fsdp_train.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
ATOL = 1e-6


def _launch(out: Path, runs: list[str], nproc: int, timeout: float = 240) -> None:
    launch(SCRIPT, [str(out), *runs], out, nproc=nproc, timeout=timeout)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    # one process: references (single) and the 1-process FSDP checkpoint that 2 processes resume
    # (H writes asynchronously, then P, Q, W are more FSDP Trainers in the same process: each makes and destroys its
    # one-process group)
    _launch(
        out,
        [
            "F:single:16:8:clip=0.5:weights=1",
            "G:single:16:4",
            "H:fsdp:16:4:clip=0.5:save=4:async=1",
            "P:fsdp:16:2:precision=bf16-mixed",
            "Q:fsdp:16:3:precision=16-mixed:clip=0.5",
            "W:fsdp:16:3:accum=2:save=1",
            "N:single:16:8:norms=1",
            "V:single:16:8:ema=1",
            "ES:single:16:0:epochs=8:es=1:ema=1",
            "U:single:16:0:swa=2:epochs=3",
            "OS:single:16:4:unseeded=1",
        ],
        1,
    )
    shutil.copytree(out / "H" / "checkpoints", out / "I" / "checkpoints")
    # two processes x half the batch (R: clip_grad re-assigned in before_train, after the strategy prepared the run);
    # --trainer-group: the script makes no process group, the first Trainer (GX) joins the launcher's and every later
    # one finds it (GX, GY, GZ: test_later_trainers_in_one_torchrun_process_join_the_launchers_group)
    _launch(
        out,
        [
            "--trainer-group",
            "GX:ddp:8:4:save=2",
            "GY:fsdp:8:4:save=2:async=1",
            "GZ:fsdp:8:4:save=2:async=1",
            "A:fsdp:8:8:clip=0.5:save=2:keep=2:async=1:weights=1",
            "B:fsdp:4:8:accum=2",
            "C:fsdp:8:4:clip=0.5:save=4",
            "I:fsdp:8:8:clip=0.5:save=4:resume=1",
            f"L:fsdp:8:1:lr=0:load={out / 'F' / 'weights.safetensors'}",
            "R:fsdp:8:8:clip=4:reclip=0.5",
            "M:fsdp:8:8:norms=1",
            "X:fsdp:8:8:ema=1:save=4",
            f"Y:fsdp:8:8:ema=1:resume={out / 'X' / 'checkpoints' / 'iter_4.dcp'}",
            "T:fsdp:8:0:swa=2:epochs=3:save=10",
            f"Z:fsdp:8:0:swa=2:epochs=3:resume={out / 'T' / 'checkpoints' / 'iter_10.dcp'}",
            "ET:fsdp:8:0:epochs=8:es=1:ema=1",
            "EU:ddp:8:0:epochs=8:es=1:ema=1",
            "NA:ddp:8:12:accum=4:nanat=9",
            "NB:fsdp:8:8:nanat=3",
            "SD:ddp:8:8:accum=2:nanat=4:skipnan=1",
            "SF:fsdp:8:8:accum=2:nanat=4:skipnan=1",
            "PT:fsdp:8:20:sigterm=3:save=100",
            "QA:fsdp:8:4:prof=1",
            "ST:ddp:8:6:stall=3",
            "OF:fsdp:8:4:unseeded=1",
            "OD:ddp:8:4:unseeded=1",
        ],
        2,
    )
    # a newer checkpoint with a truncated shard, named by `latest`: resume=True must skip it
    ckpts = out / "C" / "checkpoints"
    shutil.copytree(ckpts / "iter_4.dcp", ckpts / "iter_6.dcp")
    shard = ckpts / "iter_6.dcp" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:40])
    (ckpts / "latest").write_text("iter_6.dcp\n")
    shutil.copytree(ckpts, out / "S" / "checkpoints")  # the same folder, resumed with resume=True by strategy="single"
    # one process resumes the 2-process checkpoint: without a process group (single), and as a 1-process FSDP run
    # ... and the async checkpoint of iteration 6
    _launch(
        out,
        [
            f"E:single:16:8:clip=0.5:resume={ckpts / 'iter_4.dcp'}",
            "S:single:16:8:clip=0.5:resume=1",
            "D:fsdp:16:8:clip=0.5:save=4:resume=1:work=C",
            f"K:single:16:8:clip=0.5:resume={out / 'A' / 'checkpoints' / 'iter_6.dcp'}",
            f"J:single:16:8:ema=1:resume={out / 'X' / 'checkpoints' / 'iter_4.dcp'}",
        ],
        1,
    )
    return out


def _result(out: Path, name: str, rank: int = 0) -> dict:
    return torch.load(out / name / f"result_rank{rank}.pt", weights_only=True)


def _assert_params_close(a: dict, b: dict) -> None:
    assert a["params"].keys() == b["params"].keys()
    for k, v in b["params"].items():
        torch.testing.assert_close(a["params"][k], v, atol=ATOL, rtol=0, msg=k)


def test_fsdp_two_processes_equal_one_process_with_clipping(out: Path) -> None:
    """2 ranks x batch 8, sharded, gradient clipping active (max_norm 0.5) == 1 process x batch 16: weights and the
    clipped norm."""
    fsdp, single = _result(out, "A"), _result(out, "F")
    assert (fsdp["strategy"], fsdp["world_size"], single["strategy"]) == ("fsdp", 2, "single")
    _assert_params_close(fsdp, single)
    assert single["grad_norm"] > 0.5  # clipping did act
    for rank in (0, 1):  # the norm over every rank's shards, the same on each rank
        torch.testing.assert_close(_result(out, "A", rank)["grad_norm"], single["grad_norm"], atol=1e-6, rtol=1e-6)


def test_ranks_that_drew_different_initial_weights_train_rank_0s_as_ddp_does(out: Path) -> None:
    """Each process built the model from its own draw (a script that does not seed): FSDP, like DDP, trains rank 0's
    initial
    weights (one process with batch 16 from rank 0's draw); before, each rank kept its own shard of its own draw."""
    fsdp, ddp, single = _result(out, "OF"), _result(out, "OD"), _result(out, "OS")
    _assert_params_close(fsdp, ddp)
    _assert_params_close(fsdp, single)


def test_clip_grad_assigned_after_prepare_keeps_the_sharded_norm(out: Path) -> None:
    """optim_wrapper.clip_grad = dict(max_norm=0.5) in a hook's before_train (the run built with max_norm=4, already
    sharded):
    the new threshold is used and grad_norm is still the global norm as a plain tensor, on both ranks == 1 process
    clipping at 0.5."""
    single = _result(out, "F")
    _assert_params_close(_result(out, "R"), single)
    for rank in (0, 1):
        r = _result(out, "R", rank)
        assert r["grad_norm_type"] == "Tensor", r["grad_norm_type"]
        torch.testing.assert_close(r["grad_norm"], single["grad_norm"], atol=1e-6, rtol=1e-6)


def test_fsdp_accumulation_equals_the_big_batch(out: Path) -> None:
    """2 ranks x batch 4 x accumulative_counts 2 (gradient sync off inside each window) == 1 process x batch 16."""
    _assert_params_close(_result(out, "B"), _result(out, "G"))


def test_two_process_checkpoint_resumes_on_one_process(out: Path) -> None:
    """Steps 1-4 on 2 processes, 5-8 on 1: as a 1-process FSDP run and as strategy='single' (no process group) ==
    uninterrupted."""
    single = _result(out, "F")
    for name in ("D", "E"):
        resumed = _result(out, name)
        assert resumed["iteration"] == 8 and resumed["world_size"] == 1
        _assert_params_close(resumed, single)


def test_resume_true_on_one_process_finds_the_sharded_checkpoints(out: Path) -> None:
    """strategy='single' with resume=True in the 2-process run's folder: the corrupt newest directory is skipped with a
    warning naming it,
    iter_4.dcp is read whole, and the run ends as the uninterrupted one."""
    resumed = _result(out, "S")
    assert (resumed["strategy"], resumed["world_size"], resumed["iteration"]) == ("single", 1, 8)
    assert any("iter_6.dcp" in w for w in resumed["warnings"]), resumed["warnings"]
    _assert_params_close(resumed, _result(out, "F"))


def test_async_checkpoint_holds_the_state_of_its_iteration(out: Path) -> None:
    """The async (dcp.async_save) checkpoint of iteration 6 of the 2-process run, resumed on one process ==
    uninterrupted."""
    _assert_params_close(_result(out, "K"), _result(out, "F"))


def test_one_process_checkpoint_resumes_on_two_processes(out: Path) -> None:
    """Steps 1-4 on 1 FSDP process, 5-8 on 2 == uninterrupted (both ranks)."""
    assert _result(out, "I")["iteration"] == 8
    _assert_params_close(_result(out, "I"), _result(out, "F"))


def test_corrupt_newest_checkpoint_directory_is_skipped(out: Path) -> None:
    """`latest` names a directory with a truncated shard: resume warns, names it, and takes the previous one."""
    warned = [w for w in _result(out, "D")["warnings"] if "iter_6.dcp" in w]
    assert warned and "Skipping checkpoint" in warned[0], _result(out, "D")["warnings"]


def test_sharded_checkpoints_are_directories_kept_k_with_latest(out: Path) -> None:
    """Async saves every 2 of 8 iterations, max_keep_ckpts=2: two complete directories, `latest` on the last, no
    temporary left."""
    ckpts = out / "A" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter_6.dcp", "iter_8.dcp", "latest"]
    assert (ckpts / "latest").read_text().strip() == "iter_8.dcp"
    for d in ("iter_6.dcp", "iter_8.dcp"):
        assert sorted(p.name for p in (ckpts / d).iterdir()) == [
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
            "trainer_state.pth",
        ]


def test_save_weights_under_fsdp_equals_single_process_weights(out: Path) -> None:
    """save_weights gathers the shards: the same keys as the single-process export, values within tolerance, and
    equal to the model."""
    from safetensors.torch import load_file

    fsdp, single = load_file(out / "A" / "weights.safetensors"), load_file(out / "F" / "weights.safetensors")
    assert fsdp.keys() == single.keys() == {"l1.weight", "l1.bias", "l2.weight", "l2.bias"}
    for k, v in single.items():
        torch.testing.assert_close(fsdp[k], v, atol=ATOL, rtol=0)
        assert torch.equal(fsdp[k], _result(out, "A")["params"][k])


def test_bf16_mixed_precision_becomes_the_fsdp_policy(out: Path) -> None:
    """precision='bf16-mixed': the forward sees bfloat16 parameters (MixedPrecisionPolicy), the sharded master
    weights stay float32."""
    r = _result(out, "P")
    assert (r["seen_dtype"], r["param_dtype"]) == ("torch.bfloat16", "torch.float32")


def test_single_strategy_loads_weights_from_a_sharded_checkpoint(out: Path, tmp_path: Path) -> None:
    """load_weights(dir) of a 2-process FSDP checkpoint, in a process without a process group: the full weights, as
    saved."""
    import importlib.util

    import trainwright as tw
    from trainwright.strategies.dcp_io import load_full

    spec = importlib.util.spec_from_file_location("fsdp_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ckpt = out / "C" / "checkpoints" / "iter_4.dcp"
    with tw.Trainer(model=module.MLP(), work_dir=tmp_path, strategy="single", log_level="WARNING") as trainer:
        assert trainer.load_weights(ckpt, strict=True) == ([], [])
        saved = load_full(ckpt)["model"]
        assert saved.keys() == trainer.unwrapped_model.state_dict().keys()
        for k, v in trainer.unwrapped_model.state_dict().items():
            assert torch.equal(v, saved[k]), k
        assert saved["l1.weight"].shape == (8, 4)  # whole, not a shard


def test_fp16_under_fsdp_uses_the_sharded_grad_scaler(out: Path) -> None:
    """precision='16-mixed': float16 parameters in the forward and a ShardedGradScaler (ranks agree on skipped
    steps); training stays finite."""
    r = _result(out, "Q")
    assert (r["seen_dtype"], r["scaler"], r["iteration"], r["error"]) == ("torch.float16", "ShardedGradScaler", 3, None)
    assert all(torch.isfinite(v).all() for v in r["params"].values())


def test_checkpoint_inside_an_accumulation_window_is_refused_with_the_fix(out: Path) -> None:
    r = _result(out, "W")
    assert (
        r["iteration"] == 1
        and "inside a gradient accumulation window" in r["error"]
        and "multiple of accumulative_counts" in r["error"]
    )
    assert not list((out / "W" / "checkpoints").glob("*.dcp"))  # nothing half-written


def test_load_from_full_weights_into_a_sharded_model(out: Path) -> None:
    """load_from= a single-process safetensors export on 2 FSDP ranks (one step at lr=0): the model holds exactly
    those weights."""
    from safetensors.torch import load_file

    loaded, exported = _result(out, "L"), load_file(out / "F" / "weights.safetensors")
    assert loaded["params"].keys() == exported.keys()
    for k, v in exported.items():
        assert torch.equal(loaded["params"][k], v), k


def test_later_trainers_in_one_torchrun_process_join_the_launchers_group(out: Path) -> None:
    """One script under torchrun (2 processes) that makes no process group (the fixture's 2-process launch): a DDP
    Trainer, then two FSDP Trainers with async checkpoints, one after the other (then the fixture's other runs). The
    first strategy joins the group from the launcher's environment; close() leaves it for the next Trainer
    (initialising it again could hang), and it is destroyed at exit. Every run finishes; same spec, same weights."""
    for rank in (0, 1):
        runs = [_result(out, name, rank) for name in ("GX", "GY", "GZ")]
        assert [(r["strategy"], r["world_size"], r["iteration"], r["error"]) for r in runs] == [
            ("ddp", 2, 4, None),
            ("fsdp", 2, 4, None),
            ("fsdp", 2, 4, None),
        ]
        assert all(r["group_after_close"] for r in runs)  # kept for the next Trainer
        assert json.loads((out / f"exit_rank{rank}.json").read_text()) == {
            "initialized_at_exit": False
        }  # destroyed at exit
    ddp, fsdp, again = (_result(out, name) for name in ("GX", "GY", "GZ"))
    _assert_params_close(fsdp, ddp)
    for k, v in fsdp["params"].items():
        assert torch.equal(again["params"][k], v), k
    assert sorted(p.name for p in (out / "GX" / "checkpoints").iterdir()) == ["iter_2.pth", "iter_4.pth", "latest"]
    for name in ("GY", "GZ"):
        ckpts = out / name / "checkpoints"
        assert sorted(p.name for p in ckpts.iterdir()) == ["iter_2.dcp", "iter_4.dcp", "latest"]
        assert (ckpts / "iter_4.dcp" / ".metadata").is_file()


def test_norms_hook_under_fsdp_equals_one_process(out: Path) -> None:
    """NormsHook on sharded parameters (DTensor norms combined over the shards) logs what one process logs on the
    full batch."""
    one, two = _result(out, "N")["norms"], _result(out, "M")["norms"]
    assert len(one) == len(two) == 4  # every 2nd of 8 iterations
    for a, b in zip(one, two):
        assert a.keys() == b.keys() and {"grad_norm/l1", "param_norm/l2", "update_ratio/l1"} <= a.keys()
        for k in a:
            assert abs(a[k] - b[k]) <= 1e-5 * abs(a[k]), (k, a[k], b[k])  # measured: within 3e-7 relative


def test_ema_hook_under_fsdp_averages_the_shards_and_resumes(out: Path) -> None:
    """EMAHook on a sharded model: each rank averages its shards; the gathered average equals one process's, also
    resumed from a sharded checkpoint."""
    reference = _result(out, "V")["ema"]
    assert reference.keys() == {"l1.weight", "l1.bias", "l2.weight", "l2.bias"}
    for name in (
        "X",
        "Y",
        "J",
    ):  # two processes; resumed at iteration 4 by two processes and by one (the average came through the DCP files)
        got = _result(out, name)
        assert got["iteration"] == 8 and got["error"] is None
        assert (got["restored"] or "").endswith("iter_4.dcp") == (
            name != "X"
        )  # Y and J trained iterations 5-8 only: the average at 4 came from X's checkpoint
        for k, v in reference.items():
            torch.testing.assert_close(got["ema"][k], v, atol=ATOL, rtol=0, msg=f"{name} {k}")  # measured: within 3e-8
    _assert_read_as_shards(out, "Y", 4)


def _assert_read_as_shards(out: Path, name: str, count: int) -> None:
    """A 2-process resume read each rank's shard of a hook's average (as the model's parameter of the same name), not
    the whole tensor."""
    ranks = [_result(out, name, rank)["loaded_hook_tensors"] for rank in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys() and len(ranks[0]) == count, ranks[0]
    for path, (kind, whole, own) in ranks[0].items():
        other = ranks[1][path][2]
        assert kind == "DTensor" and own[0] + other[0] == whole[0] and own[1:] == other[1:] == whole[1:], (
            path,
            whole,
            own,
            other,
        )


def test_swa_hook_under_fsdp_equals_one_process_and_resumes(out: Path) -> None:
    """SWAHook on a sharded model: the per-shard average equals one process's, also resumed mid-SWA from a sharded
    checkpoint (iteration 10: one update in)."""
    reference = _result(out, "U")
    for name in ("T", "Z"):
        got = _result(out, name)
        assert got["iteration"] == 12 and got["error"] is None
        assert (got["restored"] or "").endswith("iter_10.dcp") == (name == "Z")
        _assert_params_close(got, reference)
    _assert_read_as_shards(out, "Z", 4)


def _val_close(a: list[dict], b: list[dict]) -> None:
    assert [r.keys() for r in a] == [r.keys() for r in b]
    for ra, rb in zip(a, b):
        for k in rb:
            assert abs(ra[k] - rb[k]) <= 1e-5 * abs(rb[k]), (k, ra[k], rb[k])


def test_early_stopping_and_best_checkpoints_under_fsdp_equal_one_process(out: Path) -> None:
    """EarlyStoppingHook(val/mse, patience 1), save_best val/mse and published_keys under 2 FSDP processes: the same
    validations,
    the same stop (epoch 2 of 8), the best checkpoint as a .dcp directory, and its published copy a single .pth file
    with the
    full weights of the one-process run's (publishing read the sharded directory whole on rank 0; it used to fail
    reading it as a file)."""
    one, two = _result(out, "ES"), _result(out, "ET")
    for r in (one, two):
        assert (r["error"], r["epoch"], r["iteration"]) == (None, 2, 8)  # stopped early: val/mse got worse at epoch 2
    _val_close(two["val"], one["val"])
    names = sorted(p.name for p in (out / "ET" / "checkpoints").iterdir())
    assert (
        len(names) == 2
        and names[1] == "best_val_mse_epoch_1.dcp"
        and names[0].startswith("best_val_mse_epoch_1-")
        and names[0].endswith(".pth")
    ), names
    published = torch.load(out / "ET" / "checkpoints" / names[0], weights_only=True)
    reference = torch.load(next((out / "ES" / "checkpoints").glob("best_val_mse_epoch_1-*.pth")), weights_only=True)
    assert published.keys() == {"meta", "model"} and published["model"].keys() == reference["model"].keys()
    for k, v in reference["model"].items():
        torch.testing.assert_close(published["model"][k], v, atol=ATOL, rtol=0, msg=k)  # full tensors, not shards


def test_ema_validation_under_ddp_reports_averaged_and_raw_metrics_as_one_process(out: Path) -> None:
    """EMAHook(evaluate_on="both") under 2 DDP processes (and 2 FSDP ones): val/mse of the averaged weights and
    val/raw/mse of
    the training weights equal one process's on the full batch; the average itself too."""
    one = _result(out, "ES")
    assert {"val/mse", "val/raw/mse"} <= one["val"][0].keys()
    for name in ("EU", "ET"):
        _val_close(_result(out, name)["val"], one["val"])
        for k, v in one["ema"].items():
            torch.testing.assert_close(_result(out, name)["ema"][k], v, atol=ATOL, rtol=0, msg=f"{name} {k}")


def test_nonfinite_loss_on_one_rank_raises_on_both_at_the_same_iteration(out: Path) -> None:
    """Rank 1's loss turns NaN: both ranks raise FloatingPointError at the same flush, nobody hangs, and each message
    says what was
    replayed. DDP inside an accumulation window (weights still finite): each rank replays its own batch on the current
    weights;
    FSDP: no replay (a forward of the sharded model is a collective), said so."""
    for name, nan_at, stop, said in (
        ("NA", 9, 10, "Replayed this process's own batch on the current weights (still finite"),
        ("NB", 3, 8, "No replay under the fsdp strategy with several processes"),
    ):
        for rank in (0, 1):
            r = _result(out, name, rank)
            assert r["iteration"] == stop, (name, rank, r["iteration"])  # the same agreement point on both ranks
            assert r["error"].startswith(
                f"FloatingPointError: Loss became infinite or NaN at iteration {nan_at} on rank 1"
            ), (name, rank, r["error"])
            assert said in r["error"], (name, rank, r["error"])
            assert (
                name != "NA"
                or "With several processes the non-finite loss may have been another process's, whose log names its "
                "batch."
                in r["error"]
            )


def test_nonfinite_loss_skip_under_fsdp_equals_ddp(out: Path) -> None:
    """nonfinite_loss="skip", accumulating 2, rank 1's 4th loss NaN (the micro-batch that ends its window): both ranks
    skip it
    (agreed) and step on the window's first micro-batch; FSDP's weights equal DDP's."""
    ddp, fsdp = _result(out, "SD"), _result(out, "SF")
    for name in ("SD", "SF"):
        for rank in (0, 1):
            r = _result(out, name, rank)
            assert (r["error"], r["iteration"], r["skipped"]) == (None, 8, 1), (name, rank)
    assert all(torch.isfinite(v).all() for v in fsdp["params"].values())
    _assert_params_close(fsdp, ddp)


def test_sigterm_on_one_fsdp_rank_saves_a_sharded_checkpoint_and_exits_on_both(out: Path) -> None:
    """SIGTERM reaches rank 1 only, before its 3rd step: both ranks stop at the next agreement point (10), write one
    .dcp
    checkpoint together, and ask to exit with 143."""
    assert [(r["iteration"], r["error"], r["exit_code"]) for r in (_result(out, "PT", rank) for rank in (0, 1))] == [
        (10, None, 143)
    ] * 2
    ckpts = out / "PT" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["iter_10.dcp", "latest"]
    assert (ckpts / "iter_10.dcp" / ".metadata").is_file()


def test_profiler_under_fsdp_writes_one_trace_per_rank_in_the_run_folder(out: Path) -> None:
    """ProfilerHook(wait=0, warmup=1, active=2) on 2 FSDP processes: iterations 2-3 of each rank, side by side in the
    one run folder."""
    r = _result(out, "QA")
    assert r["error"] is None and len(r["traces"]) == 2, r["traces"]
    assert [Path(t).name for t in r["traces"]] == ["trace_rank0_iter2-3.json", "trace_rank1_iter2-3.json"]
    assert Path(r["traces"][0]).parent == Path(r["traces"][1]).parent
    for t in r["traces"]:
        assert "ProfilerStep#" in (out / t).read_text()


def test_a_rank_stuck_in_user_code_and_the_rank_waiting_for_it_both_log_where_they_are(out: Path) -> None:
    """StallHook under DDP: rank 1 waits 2.5 s in a hook before step 3, rank 0 waits for it in that step's collective;
    with timeout_s=1
    each rank logs its own report, naming its rank and showing where its main thread waits; then the run ends
    normally."""
    reports = {}
    for rank in (0, 1):
        got = _result(out, "ST", rank)
        assert got["error"] is None and got["iteration"] == 6
        found = [
            m for m in got["logged"] if m.startswith("No iteration finished") and "(the run stands at iteration 2)" in m
        ]
        assert len(found) == 1, got["logged"]  # (a slow start on a loaded machine may add a report before iteration 1)
        reports[rank] = found[0]
    assert "on rank 1 " in reports[1] and "in stuck_in_user_code" in reports[1], reports[1]
    assert "on rank 0 " in reports[0] and "in stuck_in_user_code" not in reports[0] and "in backward" in reports[0], (
        reports[0]
    )  # DDP's all-reduce
    (log,) = (out / "ST").glob("*/train.log")
    assert "No iteration finished on rank 0" in log.read_text()  # rank 0's report is in the run's log too
