"""mmengine checkpoints load and convert as plain data without running code from the file; a malicious one in the same
format is refused.

The checkpoints are written here by pickling stand-in classes under mmengine's module paths
(mmengine is not installed): the file holds exactly the globals an mmengine checkpoint holds.
"""

from __future__ import annotations

import os
import sys
import types
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import trainwright as tw
from trainwright.checkpoint import UnsafeCheckpointError, load_file
from trainwright.cli.main import main

_MODULES = (
    "mmengine",
    "mmengine.logging",
    "mmengine.logging.history_buffer",
    "mmengine.config",
    "mmengine.config.config",
)


class HistoryBuffer:
    """As mmengine's: a window of logged values and counts in numpy arrays."""

    def __init__(self, values: list[float]) -> None:
        self.max_length = 1000000
        self._log_history = np.array(values)
        self._count_history = np.ones(len(values), dtype=np.int64)


class ConfigDict(dict):
    """As mmengine's (addict's Dict): a dict subclass whose pickled state is itself."""

    def __getstate__(self) -> Any:
        return self

    def __setstate__(self, state: Any) -> None:
        self.update(state)


class Pwn:
    """What a malicious file pickles: unpickling it would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def mmengine_names() -> Iterator[None]:
    """``mmengine.*`` modules holding the stand-ins while the test writes its files; removed before anything is read."""
    saved = {name: sys.modules.get(name) for name in _MODULES}
    for name in _MODULES:
        sys.modules[name] = types.ModuleType(name)
    for cls, module in ((HistoryBuffer, "mmengine.logging.history_buffer"), (ConfigDict, "mmengine.config.config")):
        cls.__module__ = module
        setattr(sys.modules[module], cls.__name__, cls)
    yield
    for name, mod in saved.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    HistoryBuffer.__module__ = ConfigDict.__module__ = __name__


def _mmengine_checkpoint(model: nn.Module, extra: Any = None) -> dict[str, Any]:
    hub: dict[str, Any] = {
        "log_scalars": {"train/loss": HistoryBuffer([0.5, 0.25]), "train/lr": HistoryBuffer([0.1])},
        "runtime_info": {"epoch": 2, "iter": 10},
    }
    if extra is not None:
        hub["runtime_info"]["extra"] = extra
    return {
        "meta": {
            "epoch": 2,
            "iter": 10,
            "seed": np.int64(7),
            "mmengine_version": "0.10.4",
            "cfg": ConfigDict(lr=np.float64(0.1)),
        },
        "state_dict": OrderedDict(model.state_dict()),
        "message_hub": hub,
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
    }


def test_an_mmengine_checkpoint_loads_and_converts_as_plain_data(
    tmp_path: Path, mmengine_names: None, capsys: pytest.CaptureFixture[str]
) -> None:
    model = nn.Linear(3, 2)
    src, dst = tmp_path / "epoch_2.pth", tmp_path / "plain.pth"
    marker = tmp_path / "pwned"
    torch.save(_mmengine_checkpoint(model), src)
    torch.save(_mmengine_checkpoint(model, extra=Pwn(marker)), tmp_path / "evil.pth")
    for name in _MODULES:  # mmengine is gone when the files are read
        sys.modules.pop(name)

    ckpt = load_file(src)  # what resume / load_from read: no UnsafeCheckpointError
    assert ckpt["meta"]["seed"] == 7 and type(ckpt["meta"]["seed"]) is int and ckpt["meta"]["cfg"] == {"lr": 0.1}
    loss = ckpt["message_hub"]["log_scalars"]["train/loss"]
    assert loss["max_length"] == 1000000 and torch.equal(
        loss["log_history"], torch.tensor([0.5, 0.25], dtype=torch.float64)
    )
    assert torch.equal(loss["count_history"], torch.ones(2, dtype=torch.int64))

    assert main(["ckpt", "convert", "--from", "mmengine", str(src), str(dst)]) == 0
    assert f"wrote {dst}" in capsys.readouterr().out
    plain = torch.load(dst, weights_only=True)  # torch's own safe loader reads the converted file
    assert (
        plain["message_hub"]["log_scalars"]["train/lr"]["log_history"].tolist() == [0.1]
        and plain["meta"]["mmengine_version"] == "0.10.4"
    )

    fresh = nn.Linear(3, 2)
    trainer = tw.Trainer(model=fresh, work_dir=str(tmp_path / "run"))
    trainer.load_weights(src)  # what load_from= does: the weights under state_dict
    for a, b in zip(fresh.parameters(), model.parameters()):
        assert torch.equal(a, b)
    trainer.close()

    # the same format with one object that would run a command: refused, nothing runs, nothing is written
    with pytest.raises(UnsafeCheckpointError, match=r"as an mmengine checkpoint: .*posix.system.*could run code"):
        load_file(tmp_path / "evil.pth")
    assert (
        main(["ckpt", "convert", "--from", "mmengine", str(tmp_path / "evil.pth"), str(tmp_path / "evil_plain.pth")])
        == 2
    )
    assert "could run code" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "evil_plain.pth").exists()
