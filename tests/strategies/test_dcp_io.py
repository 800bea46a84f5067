"""Checkpoint directories (no process needed): publishing replaces atomically, listing and the `latest` pointer work
on directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainwright.checkpoint.io import CheckpointError
from trainwright.checkpoint.listing import find_resumable, list_checkpoints
from trainwright.strategies import dcp_io
from trainwright.strategies.single_device import SingleDeviceStrategy


def _dir(path: Path, content: str) -> Path:
    path.mkdir(parents=True)
    (path / "f").write_text(content)
    return path


def test_publish_replaces_an_existing_directory_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = _dir(tmp_path / "iter_4.dcp", "old")
    tmp = _dir(dcp_io.temp_dir(target, dcp_io.new_token()), "new")
    dcp_io.publish(tmp, target)
    assert (target / "f").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["iter_4.dcp"]


def test_directories_are_listed_newest_first_with_latest_in_front(tmp_path: Path) -> None:
    for n in (2, 10, 4):
        _dir(tmp_path / f"iter_{n}.dcp", str(n))
    _dir(tmp_path / "best_acc_iter_10.dcp", "best")
    _dir(dcp_io.temp_dir(tmp_path / "iter_12.dcp", "ab12"), "partial")
    (tmp_path / "iter_8.pth").write_bytes(b"x")
    assert [p.name for p in list_checkpoints(tmp_path, suffix=".dcp")] == ["iter_10.dcp", "iter_4.dcp", "iter_2.dcp"]
    (tmp_path / "latest").write_text("iter_4.dcp\n")
    assert [p.name for p in list_checkpoints(tmp_path, suffix=".dcp")] == ["iter_4.dcp", "iter_10.dcp", "iter_2.dcp"]


def test_find_resumable_skips_a_broken_directory_with_its_loader(tmp_path: Path) -> None:
    _dir(tmp_path / "iter_2.dcp", "ok")
    _dir(tmp_path / "iter_4.dcp", "broken")

    def load(p: Path) -> dict:
        if (p / "f").read_text() == "broken":
            raise CheckpointError(f"Cannot read checkpoint {p}")
        return {"name": p.name}

    with pytest.warns(UserWarning, match="iter_4.dcp"):
        path, ckpt = find_resumable(tmp_path, suffix=".dcp", load=load)
    assert (path.name, ckpt) == ("iter_2.dcp", {"name": "iter_2.dcp"})


def test_a_directory_without_dcp_metadata_is_not_a_checkpoint(tmp_path: Path) -> None:
    """strategy='single' reads DCP directories; any other directory is the usual 'does not exist (it is a directory)'
    error."""
    with pytest.raises(FileNotFoundError, match="it is a directory"):
        SingleDeviceStrategy().load_checkpoint(_dir(tmp_path / "iter_2.dcp", "x"))


def test_a_dcp_directory_without_trainer_state_is_a_checkpoint_error(tmp_path: Path) -> None:
    d = _dir(tmp_path / "iter_2.dcp", "x")
    (d / ".metadata").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no trainer_state.pth"):
        SingleDeviceStrategy().load_checkpoint(d)


def test_a_failed_shard_write_is_an_oserror_naming_the_path_and_replaces_nothing(tmp_path: Path) -> None:
    """DCP's CheckpointException (a BaseException, a pasted traceback) becomes an OSError with the path; the old
    checkpoint stays."""
    import torch

    target = _dir(tmp_path / "iter_4.dcp", "old")
    blocked = dcp_io.temp_dir(target, "ab12")
    blocked.write_text("a file where the temporary directory goes")  # the shard write cannot create its directory
    with pytest.raises(
        OSError,
        match=r"Cannot write checkpoint '.*iter_4\.dcp': writing its shards failed \(CheckpointException: "
        r"FileExistsError.*Nothing was replaced",
    ):
        dcp_io.save_shards({"model": {"w": torch.ones(2)}}, blocked, target)
    assert (target / "f").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["iter_4.dcp"]  # no temporary left


def test_a_one_process_fsdp_run_with_plain_sgd_resumes_equal_to_an_uninterrupted_one(tmp_path: Path) -> None:
    """Plain SGD keeps no optimizer state: its sharded checkpoint resumes (torch's full-state loader needs a tensor
    to learn the device from)."""
    import torch
    from conftest import make_trainer

    def run(name: str, epochs: int, **kw: object) -> dict[str, torch.Tensor]:
        t = make_trainer(tmp_path / name, strategy="fsdp", train_cfg=dict(by_epoch=True, max_epochs=epochs), **kw)  # type: ignore[arg-type]
        t.train()
        weights = {
            k: v.detach().clone() for k, v in t.strategy.full_model_state_dict().items()
        }  # gathered, while the group lives
        t.close()
        return weights

    reference = run("ref", 2)
    run("first", 1, default_hooks=dict(checkpoint=dict(interval=1)))
    (saved,) = (tmp_path / "first").rglob("epoch_1.dcp")
    resumed = run("resumed", 2, resume=str(saved))
    assert reference.keys() == resumed.keys()
    for k in reference:
        assert torch.equal(reference[k], resumed[k]), k


def test_an_unreadable_sharded_checkpoint_names_the_ranks_whose_copy_failed(tmp_path: Path) -> None:
    """Node-local work dirs: rank 1's copy is truncated. Rank 0 (whose copy reads) must not be told to delete its
    own, intact one."""
    from torch.distributed.checkpoint.api import CheckpointException

    from trainwright.strategies.dcp_io import _unreadable

    broken = CheckpointException("load failed", {1: (RuntimeError("failed finding central directory"), None)})
    msg = _unreadable(tmp_path / "iter_8.dcp", broken)  # read on rank 0 (no process group here)
    assert (
        "this rank's (0) copy reads, the read failed on rank(s) [1] (RuntimeError: failed finding central directory)"
        in msg
    )
    assert "repair or delete the directory on their node" in msg and "delete or move this directory" not in msg
    own = _unreadable(
        tmp_path / "iter_8.dcp", CheckpointException("load failed", {0: (RuntimeError("truncated"), None)})
    )
    assert (
        "on rank 0 (the read failed on rank(s) [0]): RuntimeError: truncated" in own
        and "delete or move this directory" in own
    )
