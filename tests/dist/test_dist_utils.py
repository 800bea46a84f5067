"""Single-process behaviour of the dist helpers (the 2-process run is in tests/evaluation)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed

from trainwright import dist

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture
def no_process_group_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every process-group query / collective of torch.distributed fail if it is reached."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a torch.distributed process-group call was made while not distributed")

    for name in ("get_rank", "get_world_size", "barrier", "all_reduce", "all_gather_object", "broadcast_object_list"):
        monkeypatch.setattr(torch.distributed, name, forbidden)


def test_answers_like_a_single_process_without_touching_process_groups(no_process_group_calls: None) -> None:
    assert not torch.distributed.is_initialized()
    assert dist.is_distributed() is False
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_dist_info() == (0, 1)
    assert dist.is_main_process()
    dist.barrier()
    assert dist.all_gather_object({"a": 1}) == [{"a": 1}]
    assert dist.broadcast_object("x") == "x"


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_all_reduce_is_an_in_place_no_op_when_not_distributed(op: str, no_process_group_calls: None) -> None:
    t = torch.tensor([1.0, -2.0, 3.0])
    before = t.clone()
    out = dist.all_reduce(t, op=op)  # type: ignore[arg-type]
    assert out is t
    torch.testing.assert_close(t, before)


def test_all_reduce_rejects_unknown_op_and_integer_mean() -> None:
    with pytest.raises(ValueError, match="must be one of"):
        dist.all_reduce(torch.ones(2), op="avg")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tensor\.float\(\)"):
        dist.all_reduce(torch.ones(2, dtype=torch.int64), op="mean")


def test_master_only_runs_on_rank_zero_and_keeps_metadata() -> None:
    calls: list[int] = []

    @dist.master_only
    def record(x: int) -> int:
        """Doc."""
        calls.append(x)
        return x * 2

    assert record(3) == 6 and calls == [3]
    assert record.__name__ == "record" and record.__doc__ == "Doc."


def test_local_rank_comes_from_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    assert dist.get_local_rank() == 0
    clean_env.setenv("LOCAL_RANK", "3")
    assert dist.get_local_rank() == 3


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "none"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "pytorch"),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4"}, "slurm"),
        ({"SLURM_NTASKS": "4"}, "none"),  # inside salloc but not started by srun
        ({"OMPI_COMM_WORLD_RANK": "0"}, "mpi"),
        # torchrun inside a SLURM allocation: torchrun's variables describe the processes
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, "pytorch"),
        ({"RANK": "0"}, "none"),
    ],
)
def test_detect_launcher(clean_env: pytest.MonkeyPatch, env: dict[str, str], expected: str) -> None:
    for key, value in env.items():
        clean_env.setenv(key, value)
    assert dist.detect_launcher() == expected
