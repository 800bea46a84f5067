"""PreemptionHook in one process: signal → finish the step → save → exit status; the agreement point."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import chaos_train as ct
import pytest
import torch

import trainwright as tw
from trainwright.checkpoint import read_latest
from trainwright.hooks.hook import Hook
from trainwright.hooks.preemption import PreemptionHook
from trainwright.strategies.single_device import SingleDeviceStrategy


class SendSignal(Hook):
    """Sends ``sig`` to this process in the middle of iteration ``at`` (before its step)."""

    priority = "HIGHEST"

    def __init__(self, at: int, sig: int = signal.SIGTERM) -> None:
        self.at = at
        self.sig = sig

    def before_train_iter(self, trainer: tw.Trainer, batch_idx: int, data_batch: Any = None) -> None:
        if trainer.progress.iteration + 1 == self.at:
            os.kill(os.getpid(), self.sig)


def _previous_handlers() -> dict[int, Any]:
    return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGUSR1, 138)])
def test_signal_finishes_step_saves_and_exits_with_documented_status(tmp_path: Path, sig: int, code: int) -> None:
    before = _previous_handlers()
    t = ct.build(
        str(tmp_path),
        hooks=[SendSignal(at=7, sig=sig)],
        checkpoint=dict(interval=4, by_epoch=False, save_best=None, max_keep_ckpts=-1),
    )
    with pytest.raises(SystemExit) as exc:
        t.train()
    assert exc.value.code == code
    assert t.preempted and t.progress.iteration == 7  # the signalled step was finished, no more
    assert read_latest(tmp_path / "checkpoints") == "iter_7.pth"
    ckpt = torch.load(tmp_path / "checkpoints" / "iter_7.pth", weights_only=True)
    assert ckpt["progress"]["iteration"] == 7
    assert _previous_handlers() == before, "the previous signal handlers were not restored"


def test_a_signal_at_a_saved_iteration_names_the_checkpoint_that_holds_it(tmp_path: Path) -> None:
    t = ct.build(
        str(tmp_path),
        hooks=[SendSignal(at=8)],
        checkpoint=dict(interval=4, by_epoch=False, save_best=None, max_keep_ckpts=-1),
    )
    with pytest.raises(SystemExit):
        t.train()
    t.flush_logs()
    (log,) = tmp_path.glob("*/train.log")
    assert (
        f"Preempted at iteration 8: this iteration was checkpointed already ({tmp_path / 'checkpoints' / 'iter_8.pth'})"
        in log.read_text()
    )


def test_exit_code_none_returns_normally_and_resume_continues(tmp_path: Path) -> None:
    ref = ct.build(str(tmp_path / "ref"))
    ref.train()
    t = ct.build(
        str(tmp_path / "w"),
        hooks=[SendSignal(at=10)],
        default_hooks=dict(
            preemption=dict(exit_code=None),
            checkpoint=dict(interval=4, by_epoch=False, save_best=None),
            logger=dict(interval=2),
        ),
    )
    t.train()
    assert t.preempted and t.progress.iteration == 10
    t2 = ct.build(str(tmp_path / "w"), experiment="b", checkpoint=dict(interval=4, by_epoch=False, save_best=None))
    t2.train()
    assert not t2.preempted
    for k, v in ref.unwrapped_model.state_dict().items():
        assert torch.equal(v, t2.unwrapped_model.state_dict()[k]), k


class OtherRankSignalled(SingleDeviceStrategy):
    """Rank 0 of two; from its ``n``-th collective on, the other rank proposes a stop (a signal reached it)."""

    def __init__(self, n: int) -> None:
        super().__init__("cpu")
        self.n = n
        self.asked_at: list[int] = []
        self.trainer: tw.Trainer | None = None

    @property
    def world_size(self) -> int:
        return 2

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        assert self.trainer is not None
        it = self.trainer.progress.iteration
        # an agreement point's first collective carries the decisions (a point's numbers may follow in a second one; an
        # epoch's
        # end agrees on a hook's stop request in a 1-element one)
        header = tensor.numel() > 1 and (not self.asked_at or self.asked_at[-1] != it)
        other = tensor.clone()
        if header:
            self.asked_at.append(it)
            if len(self.asked_at) >= self.n:
                other[1] = 1.0  # the stop proposal of the agreement's collective
        return torch.stack([tensor, other])


def test_stop_is_decided_at_the_agreement_point(tmp_path: Path) -> None:
    """Agreement points every 4 iterations, lines every 10: the other rank's stop arrives with the third point (12),
    where both stop."""
    strategy = OtherRankSignalled(n=3)
    t = ct.build(
        str(tmp_path),
        strategy=strategy,
        default_hooks=dict(preemption=dict(exit_code=None), checkpoint=dict(interval=-1, save_best=None)),
    )
    strategy.trainer = t
    t.agreement.every = 4
    t.train()
    assert strategy.asked_at == [4, 8, 12]  # one collective per agreement point, none at the logging iteration 10
    assert t.preempted and t.progress.iteration == 12
    assert read_latest(tmp_path / "checkpoints") == "iter_12.pth"  # saved though no signal reached this process


def test_preemption_without_checkpoint_hook_still_saves(tmp_path: Path) -> None:
    t = ct.build(
        str(tmp_path), hooks=[SendSignal(at=5)], default_hooks=dict(checkpoint=None, preemption=dict(exit_code=None))
    )
    t.train()
    assert read_latest(tmp_path / "checkpoints") == "iter_5.pth"


def test_handlers_restored_after_an_error(tmp_path: Path) -> None:
    before = _previous_handlers()

    class Boom(Hook):
        def after_train_iter(
            self, trainer: tw.Trainer, batch_idx: int, data_batch: Any = None, outputs: Any = None
        ) -> None:
            assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]  # installed while training
            raise RuntimeError("boom")

    t = ct.build(str(tmp_path), hooks=[Boom()])
    with pytest.raises(RuntimeError, match="boom"):
        t.train()
    assert _previous_handlers() == before


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="check_interval"):
        PreemptionHook(check_interval=0)
    with pytest.raises(ValueError, match="Unknown signal"):
        PreemptionHook(signals=["SIGNOPE"])
    with pytest.raises(ValueError, match="exit_code"):
        PreemptionHook(exit_code="requeue")


# -- SLURM requeue (SIGUSR1 with SLURM_JOB_ID set) ------------------------------------------------
def fake_scontrol(bin_dir: Path, status: int = 0) -> Path:
    """A ``scontrol`` on PATH that appends its arguments to ``bin_dir/scontrol.args`` and exits with ``status``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    record = bin_dir / "scontrol.args"
    script = bin_dir / "scontrol"
    script.write_text(
        f'#!/bin/sh\necho "$@" >> "{record}"\n'
        + (f'echo "scontrol: error: Requested operation is presently disabled" >&2\nexit {status}\n' if status else "")
    )
    script.chmod(0o755)
    return record


def _slurm_env(monkeypatch: pytest.MonkeyPatch, bin_dir: Path | None) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    for k in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(
        "PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin" if bin_dir is not None else "/nonexistent"
    )


def _train_until_signal(tmp_path: Path, sig: int = signal.SIGUSR1, **preemption: Any) -> tuple[tw.Trainer, int, str]:
    t = ct.build(
        str(tmp_path / "w"),
        hooks=[SendSignal(at=6, sig=sig)],
        default_hooks=dict(preemption=preemption, checkpoint=dict(interval=4, by_epoch=False, save_best=None)),
    )
    with pytest.raises(SystemExit) as exc:
        t.train()
    t.flush_logs()
    (log,) = (tmp_path / "w").glob("*/train.log")
    return t, int(exc.value.code), log.read_text()


def test_sigusr1_under_slurm_requeues_the_job_and_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = fake_scontrol(tmp_path / "bin")
    _slurm_env(monkeypatch, tmp_path / "bin")
    t, code, log = _train_until_signal(tmp_path)
    assert code == 0 and t.progress.iteration == 6
    assert record.read_text().split() == ["requeue", "4242"]
    assert read_latest(tmp_path / "w" / "checkpoints") == "iter_6.pth"
    assert "SLURM job 4242 requeued" in log


def test_array_task_is_requeued_by_its_array_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = fake_scontrol(tmp_path / "bin")
    _slurm_env(monkeypatch, tmp_path / "bin")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4240")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert _train_until_signal(tmp_path)[1] == 0
    assert record.read_text().split() == ["requeue", "4240_2"]


@pytest.mark.parametrize("case", ["scontrol fails", "no scontrol"])
def test_a_failed_requeue_is_reported_with_the_manual_command_and_keeps_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    if case == "scontrol fails":
        record = fake_scontrol(tmp_path / "bin", status=1)
        _slurm_env(monkeypatch, tmp_path / "bin")
    else:
        _slurm_env(monkeypatch, None)
    _, code, log = _train_until_signal(tmp_path)
    assert code == 138  # as without requeue: the job does not come back
    assert "SLURM job 4242 was NOT requeued" in log and "`scontrol requeue 4242`" in log
    assert (
        "scontrol exited with status 1: scontrol: error: Requested operation is presently disabled"
        if case == "scontrol fails"
        else "scontrol is not on PATH"
    ) in log
    if case == "scontrol fails":
        assert record.read_text().split() == ["requeue", "4242"]
    assert read_latest(tmp_path / "w" / "checkpoints") == "iter_6.pth"
    assert (tmp_path / "w" / "checkpoints" / "iter_6.pth").is_file()


@pytest.mark.parametrize(("sig", "preemption"), [(signal.SIGUSR1, dict(requeue=False)), (signal.SIGTERM, {})])
def test_no_requeue_when_switched_off_or_on_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int, preemption: dict
) -> None:
    record = fake_scontrol(tmp_path / "bin")
    _slurm_env(monkeypatch, tmp_path / "bin")
    _, code, log = _train_until_signal(tmp_path, sig, **preemption)
    assert code == 128 + sig
    assert not record.exists() and "requeued" not in log and "scontrol" not in log
    assert read_latest(tmp_path / "w" / "checkpoints") == "iter_6.pth"
