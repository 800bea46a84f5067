"""Single-process behaviour of the dist helpers (the 2-process run is in tests/evaluation)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed

from trainwright import dist

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")


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


SLURM_2x2 = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu-node[007-008]"}
MPI_1x2 = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ("none", 0, 1, 0, None, None)),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h0", "MASTER_PORT": "1234"}, ("pytorch", 1, 2, 1, "h0", "1234")),
        # srun: the rendezvous host is the first node of the allocation, the port torchrun's default
        (SLURM_2x2, ("slurm", 3, 4, 1, "gpu-node007", "29500")),
        # the job script's choice wins
        ({**SLURM_2x2, "MASTER_ADDR": "login1", "MASTER_PORT": "4000"}, ("slurm", 3, 4, 1, "login1", "4000")),
        ({**SLURM_2x2, "SLURM_JOB_NODELIST": "", "SLURM_NODELIST": "a1,b2"}, ("slurm", 3, 4, 1, "a1", "29500")),
        # a job id gives each job its own port (two jobs on one node do not collide): 15000 + id mod 20000
        ({**SLURM_2x2, "SLURM_JOB_ID": "4242"}, ("slurm", 3, 4, 1, "gpu-node007", "19242")),
        ({**SLURM_2x2, "SLURM_JOB_ID": "123456"}, ("slurm", 3, 4, 1, "gpu-node007", "18456")),
        # mpirun on one node: every process is local, so this host is the rendezvous
        (MPI_1x2, ("mpi", 1, 2, 1, "127.0.0.1", "29500")),
        # several nodes: MASTER_ADDR must be given
        ({**MPI_1x2, "OMPI_COMM_WORLD_SIZE": "4"}, ("mpi", 1, 4, 1, None, "29500")),
        # torchrun inside an allocation: torchrun's variables describe the processes
        ({**SLURM_2x2, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "5"}, ("pytorch", 0, 2, 0, "h", "5")),
    ],
)
def test_resolve_launch_reads_rank_world_and_local_rank_of_each_launcher(env: dict[str, str], expected: tuple) -> None:
    assert tuple(dist.resolve_launch(env)) == expected


@pytest.mark.parametrize("env", [{**SLURM_2x2, "SLURM_PROCID": "4"}, {"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "5"}])
def test_a_rank_outside_the_world_is_refused_at_once(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"launch: this process's rank \d \((SLURM_PROCID|RANK)\) is not below the number of processes"):
        dist.resolve_launch(env)


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("node1", "node1"), ("gpu[003-005,010]", "gpu003"), ("a1,b[2-3]", "a1"), ("gpu[3,5]-ib", "gpu3-ib"), ("rack[1-2]-n[07-08],x", "rack1-n07")],
)
def test_first_slurm_host(nodelist: str, host: str) -> None:
    assert dist.first_slurm_host(nodelist) == host


def test_first_slurm_host_of_a_broken_list_names_the_fix() -> None:
    with pytest.raises(ValueError, match="set MASTER_ADDR"):
        dist.first_slurm_host("gpu[003-005")


def test_export_launcher_env_fills_in_what_torch_distributed_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in [k for k in os.environ if k.startswith(("SLURM_", "OMPI_"))]:
        monkeypatch.delenv(key)
    # export_launcher_env sets them: undone after the test
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    for key, value in SLURM_2x2.items():
        monkeypatch.setenv(key, value)
    assert dist.get_local_rank() == 1  # known before the process group exists (the default CUDA device uses it)
    assert dist.launched_world_size() == 4
    dist.export_launcher_env()
    assert {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu-node007", "MASTER_PORT": "29500",
    }
