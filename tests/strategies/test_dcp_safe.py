"""A sharded (DCP) checkpoint is read without running code from it: a crafted ``.metadata`` or non-tensor entry is
refused by name, before anything of it runs (torch's DCP reader alone would unpickle both)."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest
import torch

from trainwright.checkpoint import UnsafeCheckpointError, atomic_save
from trainwright.cli.main import main
from trainwright.strategies import dcp_io


class Touch:
    """Pickles as a call of ``Path.touch(marker)``: loading it unsafely creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _sharded(folder: Path, extra: object = None) -> Path:
    state = {
        "model": {"w": torch.arange(6.0).reshape(2, 3)},
        "optim_wrapper": {"optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": ["w"], "extra": extra}]}},
        "meta": {"format_version": 1},
    }
    sharded, rest = dcp_io.split(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp_io.save_shards(sharded, folder, folder)
    atomic_save(rest, folder / dcp_io.TRAINER_STATE)
    return folder


def test_a_plain_sharded_checkpoint_reads(tmp_path: Path) -> None:
    ckpt = dcp_io.load_full(_sharded(tmp_path / "ok.dcp"))
    assert torch.equal(ckpt["model"]["w"], torch.arange(6.0).reshape(2, 3))
    assert ckpt["optim_wrapper"]["optimizer"]["param_groups"][0]["lr"] == 0.1


def test_a_crafted_entry_is_refused_and_never_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    folder = _sharded(tmp_path / "entry.dcp", extra=Touch(marker))
    assert not marker.exists()
    with pytest.raises(UnsafeCheckpointError, match=r"entry.dcp'.*its entry .*param_groups.*nothing from it was"):
        dcp_io.load_full(folder)
    assert main(["ckpt", "inspect", str(folder)]) == 2
    assert "Refused to read checkpoint" in capsys.readouterr().err
    assert not marker.exists()


def test_a_crafted_metadata_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    folder = _sharded(tmp_path / "meta.dcp")
    (folder / ".metadata").write_bytes(pickle.dumps(Touch(marker)))
    with pytest.raises(UnsafeCheckpointError, match=r"meta.dcp'.*its \.metadata asks for pathlib.Path.touch"):
        dcp_io.load_full(folder)
    with pytest.raises(UnsafeCheckpointError, match=r"asks for pathlib.Path.touch"):
        dcp_io.saved_shapes(folder, "model.")
    assert not marker.exists()
