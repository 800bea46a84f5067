"""``trainwright ckpt inspect`` / ``ckpt diff`` on a single file, a sharded (DCP) directory and S3 (moto_server)."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import pytest
import torch
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.checkpoint import atomic_save, load_file
from trainwright.cli.main import main
from trainwright.strategies import dcp_io


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """iter_2.pth and iter_4.pth of one run (SGD with momentum), iter_2.dcp (the same state, sharded as the FSDP
    strategy writes it) and other_lr.pth (iter_2 with another lr in its settings)."""
    work = tmp_path_factory.mktemp("inspect")
    with tw.Trainer(
        model=LinearReg(),
        work_dir=work,
        train_dataloader=DataLoader(regression_set(8), batch_size=2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=dict(by_epoch=False, interval=2)),
        randomness=dict(seed=0),
        log_level="WARNING",
    ) as t:
        t.train()
    d = work / "checkpoints"
    state = load_file(d / "iter_2.pth")
    sharded, rest = dcp_io.split(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process": it is
        dcp_io.save_shards(sharded, d / "iter_2.dcp", d / "iter_2.dcp")  # dcp.save in this one process
    atomic_save(rest, d / "iter_2.dcp" / dcp_io.TRAINER_STATE)
    state["meta"]["config"]["optim_wrapper"]["optimizer"]["lr"] = 0.05
    atomic_save(state, d / "other_lr.pth")
    return d


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(["ckpt", *argv])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_inspect_lists_pieces_tensors_settings_and_versions(ckpts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _run(capsys, "inspect", str(ckpts / "iter_2.pth"))
    assert rc == 0, out
    assert f"format 1, written by trainwright {tw.__version__} with torch {torch.__version__} at " in out
    assert "run: epoch 0, iteration 2, seed 0, world_size 1" in out
    lines = out.splitlines()
    assert any(ln.split() == ["model/linear.weight", "float32", "[1,", "4]", "16", "B"] for ln in lines), out
    assert any(ln.split()[:2] == ["optim_wrapper/optimizer/state/0/momentum_buffer", "float32"] for ln in lines), out
    assert any(ln.split()[:4] == ["model", "2", "tensors", "20"] for ln in lines), out
    assert "  optim_wrapper.optimizer.lr = 0.1" in lines and "  train_cfg.max_epochs = 1" in lines

    rc, sharded = _run(capsys, "inspect", str(ckpts / "iter_2.dcp"))
    assert rc == 0, sharded
    assert sorted(sharded.splitlines()[1:]) == sorted(lines[1:])  # the same pieces, tensors, settings from the shards
    outline = dcp_io.load_outline(ckpts / "iter_2.dcp")  # what inspect read: no tensor data, the values
    weight = outline["model"]["linear.weight"]
    assert weight.is_meta and weight.shape == (1, 4) and weight.dtype == torch.float32
    assert outline["optim_wrapper"]["optimizer"]["param_groups"][0]["lr"] == 0.1


def test_diff_is_bitwise_per_tensor_and_names_settings_and_values(
    ckpts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _run(capsys, "diff", str(ckpts / "iter_2.pth"), str(ckpts / "iter_2.dcp"))
    assert rc == 0 and out.rstrip().endswith("result: equal"), out  # a file and its sharded copy

    rc, out = _run(capsys, "diff", str(ckpts / "iter_2.pth"), str(ckpts / "iter_4.pth"))
    assert rc == 1 and out.rstrip().endswith("result: different"), out
    a, b = load_file(ckpts / "iter_2.pth")["model"], load_file(ckpts / "iter_4.pth")["model"]
    wa, wb = a["linear.weight"], b["linear.weight"]
    max_abs = (wa.double() - wb.double()).abs().max().item()
    row = next(ln for ln in out.splitlines() if "model/linear.weight" in ln).split()
    assert row[:2] == ["differs", "model/linear.weight"] and float(row[4]) == pytest.approx(max_abs, rel=1e-3)
    assert row[-3:] == [
        hashlib.sha256(wa.numpy().tobytes()).hexdigest()[:12],
        "/",
        hashlib.sha256(wb.numpy().tobytes()).hexdigest()[:12],
    ]
    assert "  progress/iteration: 2 -> 4" in out and "settings: the same" in out

    rc, out = _run(capsys, "diff", str(ckpts / "iter_2.pth"), str(ckpts / "other_lr.pth"))
    assert rc == 1 and "settings that differ:\n  optim_wrapper.optimizer.lr: 0.1 -> 0.05" in out, out
    assert "tensors: 6 compared: 6 equal" in out

    rc, out = _run(capsys, "diff", str(ckpts / "iter_2.pth"), str(ckpts / "missing.pth"))
    assert rc == 2 and "missing.pth' does not exist" in out


@pytest.mark.slow
def test_inspect_and_diff_read_s3(ckpts: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from test_remote import _CREDENTIALS, MotoServer

    server = MotoServer(tmp_path / "moto.log")
    try:
        for k, v in _CREDENTIALS.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)  # a plain URL: endpoint and keys from the environment
        fs = server.fs()
        fs.mkdir("ckpts")
        fs.put(str(ckpts / "iter_4.pth"), "ckpts/run/iter_4.pth")
        fs.put(str(ckpts / "iter_2.dcp"), "ckpts/run/iter_2.dcp", recursive=True)
        rc, local = _run(capsys, "inspect", str(ckpts / "iter_4.pth"))
        rc, remote = _run(capsys, "inspect", "s3://ckpts/run/iter_4.pth")
        assert rc == 0 and remote.splitlines()[0] == "checkpoint s3://ckpts/run/iter_4.pth"
        assert remote.splitlines()[1:] == local.splitlines()[1:]
        rc, local = _run(capsys, "inspect", str(ckpts / "iter_2.dcp"))
        rc, remote = _run(capsys, "inspect", "s3://ckpts/run/iter_2.dcp")
        assert rc == 0 and remote.splitlines()[1:] == local.splitlines()[1:], remote
        rc, out = _run(capsys, "diff", str(ckpts / "iter_2.pth"), "s3://ckpts/run/iter_2.dcp")
        assert rc == 0 and "result: equal" in out, out
        rc, out = _run(capsys, "diff", "s3://ckpts/run/iter_2.dcp", "s3://ckpts/run/iter_4.pth")
        assert rc == 1 and "  progress/iteration: 2 -> 4" in out, out
    finally:
        server.stop()
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()  # its filesystems point at this test's server (see test_remote.py)
