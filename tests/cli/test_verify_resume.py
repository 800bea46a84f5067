"""``trainwright verify-resume`` and ``Trainer.verify_resume``: exact resumes pass, resumes broken on purpose fail,
naming the piece and the step.

Every verification trains in fresh processes (a few seconds each), so each test asks for few
steps and one or two restarts; the broken resumes are switched on in tests/cli/verify_cfg.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainwright.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CFG = Path(__file__).with_name("verify_cfg.py")
DIGITS = ROOT / "examples" / "digits.py"
GPT = ROOT / "examples" / "char_gpt.py"


@pytest.fixture(autouse=True)
def _child_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs' processes: one thread each, TMPDIR in this test's folder, no launcher variables inherited."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for k, v in {"TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}.items():
        monkeypatch.setenv(k, v)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)


def _verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["verify-resume", *args, "--timeout", "150"])
    out = capsys.readouterr()
    return code, out.out + out.err


def _row(table: str, check: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(check + "  "))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_digits_example_resumes_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Restarted inside epoch 1 and at its last batch (its validation owed: run first by the resumed process, then
    checkpointed, resumed again): all equal, the validation after step 45 included."""
    code, out = _verify(capsys, str(DIGITS), "--steps", "46", "--at", "20", "45", "--work-dir", str(tmp_path / "v"))
    assert code == 0, out
    for check in ("restarts", "batches", "losses", "parameters", "optimizer", "schedulers", "random streams"):
        assert "equal" in _row(out, check), out
    assert "equal" in _row(out, "validation") and "1 validation(s), after step 45" in out, out
    assert "2 fresh processes resumed at 20, 45" in out
    assert "resume is exact" in out
    assert (tmp_path / "v" / "resumed" / "records" / "segment2.rank0.jsonl").is_file()  # the records are kept


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_two_gloo_processes_resume_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each run under torch.distributed.run with 2 processes (DDP, gloo): every rank's batches and losses compared.

    The default restarts: 6 batches per rank and epoch, windows of 2, so one restart falls inside a window, where each
    rank resumes its own partial gradients (DDP's no_sync left them unreduced; they differ per rank)."""
    code, out = _verify(capsys, str(CFG), "--nproc", "2", "--steps", "6", "--work-dir", str(tmp_path))
    assert code == 0, out
    assert "6 steps x 2 ranks" in _row(out, "batches"), out
    assert "5 (inside epoch 1, inside an accumulation window)" in out
    assert "equal" in _row(out, "parameters"), out
    assert (tmp_path / "resumed" / "records" / "segment1.rank1.jsonl").is_file()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_gpt_example_resumes_exactly(nproc: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The character GPT (bf16, AdamW, warmup + cosine) restarted mid-epoch, on 1 process and under DDP on 2."""
    code, out = _verify(
        capsys, str(GPT), "--nproc", str(nproc), "--steps", "8", "--at", "4", "--work-dir", str(tmp_path / "v")
    )
    assert code == 0, out
    for check in ("restarts", "batches", "losses", "parameters", "optimizer", "schedulers", "random streams"):
        assert "equal" in _row(out, check), out
    assert "8 steps" + (" x 2 ranks" if nproc == 2 else "") in _row(out, "batches"), out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dataset_that_reshuffles_at_resume_fails_at_the_step_after_the_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _verify(
        capsys,
        str(CFG),
        "--steps",
        "7",
        "--at",
        "5",
        "--work-dir",
        str(tmp_path),
        "--cfg-options",
        "custom_hooks=[{'type': 'ReshuffleOnResume'}]",
    )
    assert code == 1, out
    assert "DIFFERS  step 6: another batch" in _row(out, "batches"), out
    assert "FIRST DIVERGENCE: batches, step 6: another batch" in out
    assert "equal" in _row(out, "restarts")  # it did resume at 5: the data order is what broke


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trainer_verify_resume_names_a_hook_with_unsaved_state(tmp_path: Path) -> None:
    """In Python: ``trainer.verify_resume`` rebuilds the run from the config the trainer was built from."""
    import trainwright as tw
    from trainwright.config import Config

    cfg = Config.fromfile(CFG)
    cfg.work_dir = str(tmp_path / "built")
    trainer = tw.Trainer.from_config(cfg, custom_hooks=[dict(type="UnsavedWarmup")])
    report = trainer.verify_resume(steps=6, at=[4], work_dir=tmp_path / "v")
    trainer.close()
    assert not report.ok
    first = report.first_divergence
    assert first is not None and (first.name, first.step) == ("losses", 5), report.table()  # same batch, other loss
    checks = {c.name: c for c in report.checks}
    assert checks["batches"].ok and checks["restarts"].ok, report.table()
    assert "net.0.weight" in checks["parameters"].detail, report.table()  # the first tensor that differs, by name
    assert report.restarts == [4] and report.steps == 6


def test_usage_errors_exit_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _verify(capsys, str(CFG), "--steps", "4", "--at", "4", "--work-dir", str(tmp_path))
    assert code == 2 and "every restart must come before the last step (--steps 4)" in out
    code, out = _verify(capsys, str(CFG), "--nproc", "0")
    assert code == 2 and "--nproc must be at least 1" in out
    code, out = _verify(capsys, str(tmp_path / "missing.py"))
    assert code == 2, out
    (tmp_path / "old" / "reference").mkdir(parents=True)
    (tmp_path / "old" / "reference" / "x").write_text("")
    code, out = _verify(capsys, str(CFG), "--work-dir", str(tmp_path / "old"))
    assert code == 2 and "holds an earlier verification" in out


def test_default_restarts_cover_an_epoch_a_window_and_its_end() -> None:
    from trainwright.verify.probe import default_stop
    from trainwright.verify.resume import default_restarts

    assert default_stop(450, 45) == 90  # digits: two epochs
    assert default_stop(300, 408) == 40  # char_gpt: an epoch of 408 steps, a short run instead
    assert default_stop(30, 45) == 30  # never past the config's length

    assert default_restarts(90, 45) == [15, 45]  # digits: inside epoch 1, its last batch (a resume of a resume)
    assert default_restarts(24, 12, 2) == [4, 9, 12]  # 9: inside a window of 2
    assert default_restarts(5, 45) == [1, 3]  # shorter than an epoch: still two restarts
