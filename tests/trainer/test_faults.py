"""Faults a run must survive without losing data, hanging or going silent (issue: "No silent failures").

Each test makes the fault happen for real (a full disk is a tiny tmpfs, a second run is a
second process, a signal is a signal) and checks what a user sees: the message names the
problem and the fix, nothing on disk is lost, no process is left running.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.logging import JsonlWriter


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A real filesystem of 256 KiB (tmpfs), so that "disk full" is the kernel's ENOSPC; skipped where mounting is
    not allowed."""
    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; returns the filler file."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = b"\0" * 4096
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0")
        except OSError:
            pass
    return filler


def test_disk_full_while_logging_warns_at_once_tears_no_line_and_training_goes_on(tiny_disk: Path):
    """The audit saw lines dropped silently, a torn last line in metrics.jsonl and the error only at the end."""
    seen: list = []
    at_refill: dict[str, int] = {}

    class DiskWeather(tw.Hook):
        def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
            it = trainer.progress.iteration
            if it == 10:
                _fill(tiny_disk)
            if it == 60:
                at_refill["warnings"] = sum("metrics.jsonl" in str(w.message) for w in seen)
                (tiny_disk / "filler").unlink()

    jsonl = tiny_disk / "run" / "metrics.jsonl"
    t = tw.Trainer(
        model=LinearReg(),
        work_dir=tiny_disk,
        experiment_name="run",
        train_dataloader=DataLoader(regression_set(80), batch_size=1),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=None, logger=dict(interval=1, flush_secs=0)),
        custom_hooks=[DiskWeather()],
        writers=["console", JsonlWriter(jsonl, flush_secs=0)],
        randomness=dict(seed=0),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = caught
        try:
            t.train()
        finally:
            t.close()
    messages = [str(w.message) for w in caught]
    assert t.progress.iteration == 80  # training went on
    assert at_refill["warnings"] >= 1  # reported while the disk was full, not at the end
    assert any(
        "Could not write" in m and str(jsonl) in m and "No space left on device" in m and "free space" in m
        for m in messages
    )
    assert any("works again" in m and str(jsonl) in m for m in messages)
    text = jsonl.read_text()
    assert text.endswith("\n")
    iters = [json.loads(line)["iter"] for line in text.splitlines()]  # every line is whole JSON
    assert iters[:9] == list(range(1, 10)) and iters[-1] == 80 and iters == sorted(iters)
    assert (tiny_disk / "run" / "train.log").read_text().endswith("\n")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_log_file_on_a_full_device_warns_with_its_path_and_training_goes_on(trainer_factory):
    """Without root (no tmpfs to fill): /dev/full fails every write with ENOSPC, as a full disk does."""
    with pytest.warns(
        UserWarning, match=r"Could not write 1 metric records to '/dev/full': No space left on device.*training goes on"
    ):
        t = trainer_factory(
            writers=["console", JsonlWriter("/dev/full", flush_secs=0)],
            default_hooks=dict(checkpoint=None, logger=dict(interval=1, flush_secs=0)),
        )
        t.train()
    assert t.progress.iteration == 10


def test_trainers_hold_no_file_descriptors_after_their_runs(tmp_path: Path):
    """The audit's 60th Trainer in one process failed with "Too many open files": each leaked its train.log."""

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def one_run(i: int) -> None:
        t = tw.Trainer(
            model=LinearReg(),
            work_dir=tmp_path,
            experiment_name=f"r{i}",
            train_dataloader=DataLoader(regression_set(8), batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
            train_cfg=dict(by_epoch=True, max_epochs=1),
            default_hooks=dict(checkpoint=None),
            log_level="WARNING",
        )
        t.train()

    one_run(0)  # imports, thread pools and the like open what they keep for good
    before = open_fds()
    for i in range(1, 6):
        one_run(i)
    assert open_fds() == before
    assert all((tmp_path / f"r{i}" / "train.log").is_file() for i in range(6))


def _big_trainer(work_dir: Path, **kwargs) -> tw.Trainer:
    """A model whose checkpoint is ~160 KiB: one fits on the tiny disk, two do not."""
    kwargs.setdefault("train_cfg", dict(by_epoch=True, max_epochs=2))
    return tw.Trainer(
        model=LinearReg(d_in=200, d_out=200),
        work_dir=work_dir,
        experiment_name="run",
        train_dataloader=DataLoader(regression_set(4, d_in=200, d_out=200), batch_size=2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        log_level="WARNING",
        randomness=dict(seed=0),
        **kwargs,
    )


def _assert_only_previous_checkpoint(ckpt_dir: Path, name: str) -> None:
    assert sorted(p.name for p in ckpt_dir.iterdir() if p.name != ".lock") == sorted(
        [name, "latest"]
    )  # no temporary file left
    assert (ckpt_dir / "latest").read_text().strip() == name
    assert tw.checkpoint.load_file(ckpt_dir / name)["progress"]["epoch"] == 1


def test_disk_full_during_a_checkpoint_write_raises_the_oserror_with_the_path(tiny_disk: Path):
    """torch reports it as "RuntimeError: [enforce fail at inline_container.cc] unexpected pos"; the real OSError was
    only in __context__. The free-space check before training would refuse this run (it cannot keep two): off, so
    that the disk fills during the second save."""
    t = _big_trainer(tiny_disk, default_hooks=dict(checkpoint=dict(preflight=False)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the log files on the same full disk warn too
        with pytest.raises(
            OSError, match=r"No space left on device.*epoch_2\.pth.*previous checkpoint.*free space"
        ) as e:
            t.train()
    t.close()
    assert e.value.errno == 28 and e.value.filename == str(tiny_disk / "checkpoints" / "epoch_2.pth")
    _assert_only_previous_checkpoint(tiny_disk / "checkpoints", "epoch_1.pth")


CTRL_C_SCRIPT = r"""
import os, random, sys, signal, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as an interactive python has it, whatever this process inherited
sys.path.insert(0, {tests!r})
import torch
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader
import trainwright as tw

t = tw.Trainer(model=LinearReg(d_in=1000, d_out=2000), work_dir={work!r}, experiment_name="run", log_level="WARNING", randomness=dict(seed=0),
               train_dataloader=DataLoader(regression_set(4, d_in=1000, d_out=2000), batch_size=2), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
               train_cfg=dict(by_epoch=True, max_epochs=1))
t.train()  # epoch_1.pth and latest
durations = []
random.seed(0)
for attempt in range(100):
    in_save = False
    try:
        start = time.perf_counter()
        if durations:  # Ctrl-C somewhere inside a write of ~8 MB, timed from the recent ones (a loaded machine's times drift)
            threading.Timer(min(durations[-3:]) * random.uniform(0.1, 0.9), os.kill, (os.getpid(), signal.SIGINT)).start()
        in_save = True
        t.checkpoints.save("iter_99.pth")
        in_save = False
        durations.append(time.perf_counter() - start)
        time.sleep(min(durations[-3:]) * 2)  # a late signal lands here, outside the write
    except BaseException as e:
        if in_save:
            print("RAISED", type(e).__name__, flush=True)
            break
else:  # say why no signal landed inside a write
    print("NO SIGNAL INSIDE A WRITE: writes took", [round(d, 4) for d in durations[-5:]], "s; SIGINT handler", signal.getsignal(signal.SIGINT),
          "; launcher variables", {{k: v for k, v in os.environ.items() if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") or k.startswith(("SLURM_", "TORCHELASTIC"))}},
          "; strategy", t.strategy.name, flush=True)
"""


@pytest.mark.slow
def test_ctrl_c_during_a_checkpoint_write_stays_a_keyboard_interrupt(tmp_path: Path):
    work = tmp_path / "work"
    script = CTRL_C_SCRIPT.format(tests=str(Path(__file__).parents[1]), work=str(work))
    launcher = (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    )  # a plain one-process script, whatever this process has
    env = {k: v for k, v in os.environ.items() if k not in launcher and not k.startswith(("SLURM_", "TORCHELASTIC"))}
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(Path(tw.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert "RAISED KeyboardInterrupt" in p.stdout, p.stdout + p.stderr[-3000:]
    assert "unexpected pos" not in p.stderr
    ckpt = work / "checkpoints"
    assert not [q.name for q in ckpt.iterdir() if ".tmp." in q.name]  # the interrupted write left nothing behind
    assert (ckpt / "latest").read_text().strip() == "epoch_1.pth"
    assert tw.checkpoint.load_file(ckpt / "epoch_1.pth")["progress"]["epoch"] == 1


HTML = b"<!DOCTYPE html><html><head><title>404 Not Found</title></head><body>nginx</body></html>\n"


def _two_epochs(work: Path) -> None:
    t = tw.Trainer(
        model=LinearReg(),
        work_dir=work,
        train_dataloader=DataLoader(regression_set(8), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        log_level="WARNING",
        randomness=dict(seed=0),
    )
    with t:
        t.train()


@pytest.mark.parametrize("junk", [HTML, bytes(range(256)) * 8], ids=["html-page", "random-bytes"])
def test_a_non_zip_corrupt_checkpoint_is_corrupt_not_unsafe_and_resume_falls_back(tmp_path: Path, junk: bytes):
    """The audit saw an HTML error page reported as *unsafe* (advice: weights_only=False), blocking the fallback."""
    _two_epochs(tmp_path)
    ckpt = tmp_path / "checkpoints"
    (ckpt / "epoch_2.pth").write_bytes(junk)  # e.g. a download that saved the server's error page
    with pytest.raises(tw.checkpoint.CheckpointError) as e:
        tw.checkpoint.load_file(ckpt / "epoch_2.pth")
    assert not isinstance(e.value, tw.checkpoint.UnsafeCheckpointError)
    assert (
        "corrupt" in str(e.value)
        and "weights_only=False" not in str(e.value)
        and str(ckpt / "epoch_2.pth") in str(e.value)
    )

    t = tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(regression_set(8), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        log_level="WARNING",
        randomness=dict(seed=0),
        resume=True,
    )
    with t, pytest.warns(UserWarning, match=r"Skipping checkpoint .*epoch_2\.pth.*corrupt.*trying the previous one"):
        t.train()
    assert t.progress.epoch == 3
    assert (ckpt / "epoch_1.pth").is_file()  # nothing deleted


def test_when_every_checkpoint_is_bad_one_error_lists_them_all(tmp_path: Path):
    _two_epochs(tmp_path)
    ckpt = tmp_path / "checkpoints"
    (ckpt / "epoch_2.pth").write_bytes(HTML)
    (ckpt / "epoch_1.pth").write_bytes(b"\x00" * 100)
    t = tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(regression_set(8), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        log_level="WARNING",
        resume=True,
    )
    with t, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(
            tw.checkpoint.CheckpointError,
            match=r"(?s)No checkpoint in .* can be loaded; tried:\n  epoch_2\.pth: .*corrupt.*\n  epoch_1\.pth: "
            r".*corrupt.*Restore a checkpoint",
        ):
            t.train()
    assert t.progress.iteration == 0


class _FailingMetric(tw.evaluation.Metric):
    """Fails in its second validation (a bug in a metric, a missing label...)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def process(self, data_batch, outputs):
        self.results.append(float(outputs.sum()))

    def compute(self, results):
        self.calls += 1
        if self.calls == 2:
            raise ValueError("the metric broke")
        return {"score": sum(results)}


def test_a_failing_validation_keeps_the_checkpoint_that_was_due(tmp_path: Path):
    """The checkpoint of an epoch end waits for its validation; a metric that raised used to discard it (the epoch
    was lost)."""
    t = tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(regression_set(8), batch_size=4),
        val_dataloader=DataLoader(regression_set(4), batch_size=2),
        val_evaluator=_FailingMetric(),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        log_level="WARNING",
        randomness=dict(seed=0),
    )
    with t, pytest.raises(ValueError, match="the metric broke"):
        t.train()
    ckpt = tmp_path / "checkpoints"
    assert (ckpt / "latest").read_text().strip() == "epoch_2.pth"
    assert tw.checkpoint.load_file(ckpt / "epoch_2.pth")["progress"]["epoch"] == 2
    assert tw.checkpoint.load_file(ckpt / "epoch_1.pth")["progress"]["epoch"] == 1
    log = (t.run_dir / "train.log").read_text()
    assert "Writing epoch_2.pth, which was due before the run stopped" in log
    # the crash reason reaches train.log, with its traceback
    assert "Stopped by ValueError at epoch 2, iteration 4: the metric broke" in log
    assert "Traceback (most recent call last)" in log and "in compute" in log


def test_sigterm_during_a_long_validation_ends_it_at_the_next_batch_saves_and_stops(tmp_path: Path):
    """The audit measured 5.4 s to react on a 5 s pass; a cluster's grace period can be shorter than a validation."""
    import signal

    seen: list[int] = []
    fired: list[int] = []

    class Preempt(tw.Hook):
        def after_val_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
            seen.append(batch_idx)
            if batch_idx == 3 and not fired:
                fired.append(1)
                os.kill(os.getpid(), signal.SIGTERM)  # the cluster's notice, in the middle of the first validation

    metric = _FailingMetric()
    before = signal.getsignal(signal.SIGTERM)
    t = tw.Trainer(
        model=LinearReg(),
        work_dir=tmp_path,
        train_dataloader=DataLoader(regression_set(8), batch_size=4),
        val_dataloader=DataLoader(regression_set(200), batch_size=2),
        val_evaluator=metric,
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(preemption=dict(exit_code=None)),
        custom_hooks=[Preempt()],
        log_level="WARNING",
        randomness=dict(seed=0),
    )
    with t:
        t.train()
        assert t.preempted and t.progress.epoch == 1
        assert seen == [0, 1, 2, 3]  # of 100 batches
        assert metric.calls == 0 and metric.results == []  # no metrics from a partial pass
        ckpt = tmp_path / "checkpoints"
        assert (ckpt / "latest").read_text().strip() == "epoch_1.pth"
        assert tw.checkpoint.load_file(ckpt / "epoch_1.pth")["progress"]["epoch"] == 1
        assert signal.getsignal(signal.SIGTERM) == before
        t.flush_logs()
        log = (t.run_dir / "train.log").read_text()
        assert "val stopped after batch 4 by a stop request" in log and "Preempted at iteration 2" in log
        seen.clear()
        t.val()  # a later pass is not cut by the old request
        assert len(seen) == 100


def test_runs_started_in_the_same_second_get_their_own_run_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import time

    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20260101_120000")  # every run starts in the same second
    made = [tw.Trainer(model=LinearReg(), work_dir=tmp_path, log_level="WARNING") for _ in range(3)]
    for t in made:
        t.close()
    assert [t.run_dir.name for t in made] == ["20260101_120000", "20260101_120000_1", "20260101_120000_2"]
    assert all((t.run_dir / "train.log").is_file() for t in made)


HOLDER_SCRIPT = r"""
import os, sys, time
sys.path.insert(0, {tests!r})
from conftest import LinearReg, regression_set
from torch.utils.data import DataLoader
import trainwright as tw

class Hold(tw.Hook):
    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        if trainer.progress.iteration == 1:
            open({ready!r}, "w").close()
            for _ in range(600):  # at most 60 s
                if os.path.exists({go!r}):
                    return
                time.sleep(0.1)

t = tw.Trainer(model=LinearReg(), work_dir={work!r}, train_dataloader=DataLoader(regression_set(8), batch_size=4), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
               train_cfg=dict(by_epoch=True, max_epochs=1), custom_hooks=[Hold()], log_level="WARNING", randomness=dict(seed=0))
t.train()
t.close()
"""


def _start_holder(tmp_path: Path, work: Path, tag: str) -> tuple[subprocess.Popen, Path, Path]:
    import time

    ready, go = tmp_path / f"ready{tag}", tmp_path / f"go{tag}"
    script = HOLDER_SCRIPT.format(tests=str(Path(__file__).parents[1]), work=str(work), ready=str(ready), go=str(go))
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(Path(tw.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    )
    p = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return p, ready, go


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_second_live_run_on_one_work_dir_refuses_to_start_and_a_dead_ones_lock_is_taken_over(tmp_path: Path):
    """Two runs on one work_dir used to overwrite each other's epoch_N.pth; a later resume continued a mix of both."""
    work = tmp_path / "work"
    holder, _, go = _start_holder(tmp_path, work, "1")
    try:
        mine = tw.Trainer(
            model=LinearReg(),
            work_dir=work,
            train_dataloader=DataLoader(regression_set(8), batch_size=4),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
            train_cfg=dict(by_epoch=True, max_epochs=1),
            log_level="WARNING",
            randomness=dict(seed=0),
        )
        with pytest.raises(
            tw.checkpoint.WorkDirBusyError,
            match=rf"Another run is training in .*: pid {holder.pid} on .*, since .*another work_dir",
        ):
            mine.train()
        assert mine.progress.iteration == 0
        assert sorted(p.name for p in (work / "checkpoints").iterdir()) == [".lock"]  # the refused run wrote nothing
        go.touch()
        assert holder.wait(timeout=60) == 0  # the first run finished undisturbed
        assert (work / "checkpoints" / "latest").read_text().strip() == "epoch_1.pth"
        assert not (work / "checkpoints" / ".lock").exists()  # released at its end
    finally:
        holder.kill()
        holder.wait()

    # a run killed while training leaves its lock file; the kernel released the lock: the next run takes it over
    killed, _, _ = _start_holder(tmp_path, work / "second", "2")
    killed.kill()
    killed.wait()
    assert (work / "second" / "checkpoints" / ".lock").read_text().startswith(f"pid {killed.pid} ")
    t = tw.Trainer(
        model=LinearReg(),
        work_dir=work / "second",
        train_dataloader=DataLoader(regression_set(8), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        log_level="WARNING",
        randomness=dict(seed=0),
    )
    with t:
        t.train()
        t.flush_logs()
        assert (
            f"Took over the lock of {work / 'second' / 'checkpoints'} from pid {killed.pid} on"
            in (t.run_dir / "train.log").read_text()
        )
    assert t.progress.epoch == 1


def test_a_second_trainer_in_the_same_process_cannot_train_in_a_work_dir_in_use(trainer_factory, tmp_path: Path):
    """A notebook cell run twice: the first trainer still trains (here: from inside its own hook)."""
    errors: list[str] = []

    class TrainAnother(tw.Hook):
        def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
            if trainer.progress.iteration == 1:
                with pytest.raises(tw.checkpoint.WorkDirBusyError) as e:
                    trainer_factory(work_dir=tmp_path).train()
                errors.append(str(e.value))

    trainer_factory(work_dir=tmp_path, custom_hooks=[TrainAnother()]).train()
    assert (
        errors and f"pid {os.getpid()} " in errors[0] and "this process: another Trainer in it is training" in errors[0]
    )


# -- errors from the user's model and data: what the trainer expected, and the fix -------------------


def test_a_three_element_batch_is_not_fed_into_mode_silently(trainer_factory):
    ds = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1), torch.ones(8))  # (x, y, sample weight)
    with pytest.raises(
        TypeError, match=r"(?s)batch has 3 elements.*forward\(\*batch, mode='loss'\).*one parameter per element.*dict"
    ):
        trainer_factory(train_dataloader=DataLoader(ds, batch_size=4)).train()


def test_a_single_tensor_batch_names_the_missing_targets(trainer_factory):
    with pytest.raises(
        (TypeError, AttributeError),
        match=r"(?s)NoneType.*batch is a single tensor.*no targets.*\(input, target\) pairs",
    ):
        trainer_factory(train_dataloader=DataLoader(torch.randn(8, 4), batch_size=4)).train()


def test_a_detached_loss_names_the_loss_entry(trainer_factory):
    class Detached(LinearReg):
        def forward(self, x, y=None, mode="tensor"):
            out = self.linear(x)
            if mode == "loss":
                return {"loss_mse": torch.nn.functional.mse_loss(out, y).detach(), "mae": (out - y).abs().mean()}
            return out

    with pytest.raises(
        RuntimeError,
        match=r"(?s)does not require grad.*loss entries \['loss_mse'\] of Detached.forward.*not connected to the model's "
        r"parameters.*\.detach\(\)",
    ):
        trainer_factory(model=Detached()).train()


def test_an_iterable_dataset_without_len_says_what_the_trainer_needs(trainer_factory):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            for _ in range(8):
                yield torch.randn(4), torch.randn(1)

    with pytest.raises(
        TypeError, match=r"(?s)IterableDataset Stream has no __len__.*number of batches per epoch.*def __len__"
    ):
        trainer_factory(train_dataloader=DataLoader(Stream(), batch_size=4)).train()


# -- resume: what is continued, and what differs -------------------------------------------------------


def _resumable(work: Path, batch_size: int = 2, shuffle: bool = False, **kwargs) -> tw.Trainer:
    kwargs.setdefault("train_cfg", dict(by_epoch=True, max_epochs=1))
    kwargs.setdefault("optim_wrapper", dict(optimizer=dict(type="SGD", lr=0.1)))
    return tw.Trainer(
        model=LinearReg(),
        work_dir=work,
        train_dataloader=DataLoader(regression_set(8), batch_size=batch_size, shuffle=shuffle),
        log_level="WARNING",
        **kwargs,
    )


def test_resuming_mid_epoch_with_another_batch_size_names_both_shapes(tmp_path: Path):
    with _resumable(
        tmp_path, default_hooks=dict(checkpoint=dict(by_epoch=False, interval=2)), randomness=dict(seed=0)
    ) as t:
        t.train()  # iter_2.pth is in the middle of the 4-batch epoch
    mid = tmp_path / "checkpoints" / "iter_2.pth"
    with _resumable(tmp_path / "same", resume=mid, randomness=dict(seed=0)) as t, warnings.catch_warnings():
        warnings.simplefilter("error")  # the same loader: no warning
        t.train()
    with _resumable(tmp_path / "other", batch_size=4, resume=mid, randomness=dict(seed=0)) as t:
        t.train()
    # the warning reaches train.log (it used to go to stderr only)
    assert re.search(
        r"WARNING - Resuming in the middle of epoch 1 \(after batch 2\) with a train_dataloader of another shape: "
        r"batch_size 2 in the checkpoint, 4 now, "
        r"batches 4 in the checkpoint, 2 now\. The new loader has 2 batches per epoch, so epoch 1 is already over.*"
        r"same batch_size",
        (t.run_dir / "train.log").read_text(),
    )


def test_resuming_without_a_seed_adopts_the_checkpoints_seed(tmp_path: Path):
    """A fresh seed used to be drawn (with only a warning): the resumed epochs saw another data order."""
    with _resumable(
        tmp_path / "whole", shuffle=True, train_cfg=dict(by_epoch=True, max_epochs=2), randomness=dict(seed=123)
    ) as t:
        t.train()
        whole = [p.detach().clone() for p in t.unwrapped_model.parameters()]
    with _resumable(tmp_path / "split", shuffle=True, randomness=dict(seed=123)) as t:
        t.train()
    with (
        _resumable(tmp_path / "split", shuffle=True, train_cfg=dict(by_epoch=True, max_epochs=2), resume=True) as t,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")  # no "data order seed changed"
        t.train()
        assert t.strategy.seed == 123
        assert all(torch.equal(a, b) for a, b in zip(whole, t.unwrapped_model.parameters()))


def test_resume_says_which_edited_settings_apply_and_which_the_checkpoint_overrides(tmp_path: Path):
    """The README's resume=True used to ignore an edited lr without a word."""
    with _resumable(tmp_path, randomness=dict(seed=0)) as t:
        t.train()
    t = _resumable(
        tmp_path,
        resume=True,
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
    )
    with t:
        t.train()
        t.flush_logs()
        log = (t.run_dir / "train.log").read_text()
    assert (
        "Settings that differ from the checkpoint's run: optim_wrapper.optimizer.lr: 0.1 -> 0.05; "
        "train_cfg.max_epochs: 1 -> 2" in log
    )
    assert "edited optimizer or scheduler values do not (the checkpoint's win)" in log and "load_from=" in log
    assert t.optim_wrapper.optimizer.param_groups[0]["lr"] == 0.1  # what the message says
    assert t.progress.epoch == 2


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigterm_on_one_rank_during_validation_stops_both_ranks_at_the_same_batch(tmp_path: Path):
    """The stop inside validation goes through the preemption hook's agreement point: no rank is left in a
    collective."""
    env = dict(
        os.environ,
        TMPDIR=str(tmp_path),
        OMP_NUM_THREADS="1",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        PYTHONPATH=os.pathsep.join([str(Path(tw.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    )
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    work = tmp_path / "work"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(Path(__file__).with_name("ddp_val_stop.py")),
        str(work),
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    results = [json.loads((work / f"result_rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1]  # the same decision, at the same batch, on both ranks
    assert results[0]["preempted"] and results[0]["epoch"] == 1
    assert (
        results[0]["val_batches"] == 10
    )  # the check at batch 10 (check_interval 10 under DDP), not the 100 of the pass
    assert (work / "checkpoints" / "latest").read_text().strip() == "epoch_1.pth"
    assert tw.checkpoint.load_file(work / "checkpoints" / "epoch_1.pth")["progress"]["epoch"] == 1


@pytest.mark.filterwarnings(
    "ignore:val\\(\\) ran over the val_dataloader without a val_evaluator:UserWarning"
)  # on purpose: no metric here
def test_val_before_train_with_resume_resumes_the_checkpoint(tmp_path: Path):
    """resume=True, then val() before train(): the pass evaluates the resumed weights and train() continues the run
    (it used to start from scratch: the checkpoint was looked for before the training pieces existed)."""
    import shutil

    def trainer(work: Path, iters: int, resume: bool) -> tw.Trainer:
        return tw.Trainer(
            model=LinearReg(),
            work_dir=work,
            experiment_name=f"run{iters}",
            log_level="WARNING",
            train_dataloader=DataLoader(regression_set(32), batch_size=8, shuffle=True),
            val_dataloader=DataLoader(regression_set(16, seed=2), batch_size=8),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
            train_cfg=dict(by_epoch=False, max_iters=iters),
            resume=resume,
            randomness=dict(seed=0),
        )

    with trainer(tmp_path / "a", 4, False) as first:
        first.train()
        after4 = {k: v.clone() for k, v in first.unwrapped_model.state_dict().items()}
    shutil.copytree(tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # val() without an evaluator says it reports no metrics
        with trainer(tmp_path / "a", 8, True) as val_first:
            val_first.val()
            assert val_first.progress.iteration == 4  # restored before the pass
            assert (
                val_first.train_loop is None and val_first.optim_wrapper is None
            )  # a pass does not build the training pieces
            assert all(torch.equal(v, after4[k]) for k, v in val_first.unwrapped_model.state_dict().items()), (
                "val() saw other weights"
            )
            val_first.train()
    with trainer(tmp_path / "b", 8, True) as train_only:
        train_only.train()
    assert val_first.progress.iteration == train_only.progress.iteration == 8
    for k, v in train_only.unwrapped_model.state_dict().items():
        assert torch.equal(val_first.unwrapped_model.state_dict()[k], v), k
