"""A checkpoint written by an earlier release keeps loading: the committed ``fixtures/format_v1`` resumes, and a format
change goes through a migration (checkpoint/migrate.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from trainwright.checkpoint import load_file
from trainwright.checkpoint.migrate import FORMAT_VERSION, CheckpointFormatError, format_version, migrate

FIXTURES = Path(__file__).with_name("fixtures")


def _format_run():
    spec = importlib.util.spec_from_file_location("format_run", FIXTURES / "format_run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version", sorted(p.name for p in FIXTURES.glob("format_v*")))
def test_a_committed_checkpoint_of_an_earlier_release_resumes_to_the_same_end(tmp_path: Path, version: str) -> None:
    run = _format_run()
    folder = FIXTURES / version
    saved = load_file(folder / "iter_3.pth")
    assert saved["meta"]["format_version"] == int(version.removeprefix("format_v")) <= FORMAT_VERSION
    with run.trainer(tmp_path, resume=folder / "iter_3.pth") as t:
        t.train()
        assert t.progress.iteration == run.ITERS
        got = run.final_state(t)
    expected = torch.load(folder / "expected.pth", weights_only=True)
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():  # bitwise on the torch that wrote it; kernels of a later torch may round apart
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-7, msg=key)


def test_an_older_format_is_migrated_step_by_step_and_a_newer_one_refused() -> None:
    # format 1 named the weights "state_dict" (mmengine's name); format 2 "model"; format 3 added meta["note"]
    old = {"meta": {"format_version": 1, "trainwright_version": "0.0.1"}, "state_dict": {"w": torch.ones(2)}}
    steps = {
        1: lambda c: {**{k: v for k, v in c.items() if k != "state_dict"}, "model": c["state_dict"]},
        2: lambda c: {**c, "meta": {**c["meta"], "note": "from 2"}},
    }
    new = migrate(old, "old.pth", migrations=steps, current=3)
    assert sorted(new) == ["meta", "model"] and torch.equal(new["model"]["w"], torch.ones(2))
    assert new["meta"] == {"format_version": 3, "trainwright_version": "0.0.1", "note": "from 2"}
    assert "state_dict" in old and format_version(old) == 1  # the input is left as it was
    assert migrate(new, migrations=steps, current=3) is new  # current: nothing to do
    with pytest.raises(CheckpointFormatError, match=r"old\.pth has checkpoint format 1; no migration from format 2"):
        migrate(old, "old.pth", migrations={1: steps[1]}, current=3)
    with pytest.raises(
        CheckpointFormatError, match=r"format 3, written by a newer trainwright \(version 9\.0\).*Upgrade"
    ):
        migrate({"meta": {"format_version": 3, "trainwright_version": "9.0"}}, "x.pth", current=2)
    assert format_version({"model": {}}) == 1  # written before versions were recorded
