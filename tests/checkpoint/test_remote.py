"""Checkpoints and logs on object storage: a real S3 server (``moto_server`` on 127.0.0.1) through s3fs.

Nothing inside trainwright is mocked. Training runs are subprocesses of remote_train.py (a run
resumed in a new process must end bitwise equal to one that never stopped); the fault tests
start and kill their own servers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from forked import BackgroundRun, ForkedRun, ForkServer

import trainwright as tw
from trainwright.checkpoint import load_file
from trainwright.strategies import Strategy

pytest.importorskip("s3fs")
pytest.importorskip("moto")

SCRIPT = Path(__file__).with_name("remote_train.py")
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """``moto_server -H 127.0.0.1 -p PORT`` in a subprocess (``auth``: only known access keys are accepted)."""

    def __init__(self, log: Path, auth: bool = False, wait: bool = True) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, **_CREDENTIALS, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if auth else {}))
        exe = Path(sys.executable).with_name("moto_server")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [*cmd, "-H", "127.0.0.1", "-p", str(self.port)], stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        self._ready = False
        if wait:
            self.wait_ready()

    def wait_ready(self) -> MotoServer:
        """Wait until the server answers (``wait=False`` started it without waiting); return it."""
        if self._ready:
            return self
        log = Path(self._log.name)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        self._ready = True
        return self

    def fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(
            key="testing", secret="testing", client_kwargs=dict(endpoint_url=self.endpoint), skip_instance_cache=True
        )

    def bucket(self, name: str) -> str:
        self.fs().mkdir(name)
        return name

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._log.close()


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory, spares: Spares) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")  # the spare servers start meanwhile
    yield server
    server.stop()


class Spares:
    """Fresh servers for the tests that stop, stall or lock theirs, all started with the module's first test (a server
    takes seconds to start; none starts while a test with a 1 s deadline runs); ``count``: the plain ones."""

    def __init__(self, folder: Path, count: int) -> None:
        self._folder = folder
        self._auth = MotoServer(folder / "auth.log", auth=True, wait=False)
        self._plain = [MotoServer(folder / f"moto{i}.log", wait=False) for i in range(count)]

    def take(self, auth: bool = False) -> MotoServer:
        """A started server of its own for a test (``auth``: only known access keys are accepted); the test stops it."""
        if auth:
            return self._auth.wait_ready()
        if not self._plain:  # more taken than counted: one more, started now
            return MotoServer(self._folder / f"moto_extra_{time.monotonic_ns()}.log")
        return self._plain.pop(0).wait_ready()

    def stop(self) -> None:
        for server in (self._auth, *self._plain):
            server.stop()


@pytest.fixture(scope="module")
def spares(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spares]:
    pool = Spares(tmp_path_factory.mktemp("spares"), count=5)  # the fault tests below take 5
    yield pool
    pool.stop()


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in _CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    # fsspec caches one filesystem per set of options: one built by an earlier test from another server's
    # AWS_ENDPOINT_URL (tests/checkpoint/test_inspect.py) would still point there
    S3FileSystem = getattr(sys.modules.get("s3fs"), "S3FileSystem", None)
    if S3FileSystem is not None:
        S3FileSystem.clear_instance_cache()


def _env(tmp: Path) -> dict[str, str]:
    (tmp / "tmp").mkdir(exist_ok=True)
    return dict(os.environ, **_CREDENTIALS, TMPDIR=str(tmp / "tmp"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """The training runs' processes are forked from one that imported torch once (each is a process of its own)."""
    tmp = tmp_path_factory.mktemp("forks")
    server = ForkServer(_env(tmp), tmp / "server.log")
    yield server
    server.close()


def _start(forks: ForkServer, tmp: Path, work: str, *args: str, stderr_to_stdout: bool = False) -> ForkedRun:
    return forks.start(SCRIPT, [work, *args], env=_env(tmp), cwd=tmp, stderr_to_stdout=stderr_to_stdout)


def _finish(p: ForkedRun) -> tuple[str, str]:
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, f"run failed ({p.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
    return out, err


def _train(forks: ForkServer, tmp: Path, work: str, *args: str) -> tuple[str, str]:
    """A run to its end: its stdout and stderr."""
    return _finish(_start(forks, tmp, work, *args))


def _weights(work: Path) -> dict[str, torch.Tensor]:
    return torch.load(work / "result.pt", weights_only=True)["model"]  # type: ignore[no-any-return]


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs by {(a[k] - b[k]).abs().max().item()}"


def _no_local_url_folder(*roots: Path) -> None:
    for root in roots:
        odd = [p for p in root.rglob("*") if p.name.endswith(":") or p.name in ("s3:", "memory:")]
        assert not odd, f"a URL became a local folder: {odd}"


class Reference(BackgroundRun):
    """A 4-epoch run on local disk that never stopped, started in the background; ``weights()`` waits for its end."""

    def __init__(self, forks: ForkServer, tmp: Path) -> None:
        self._tmp = tmp
        super().__init__(_start(forks, tmp, "ref", "--epochs", "4"))

    def weights(self) -> dict[str, torch.Tensor]:
        self.finish()
        return _weights(self._tmp / "ref")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, forks: ForkServer) -> Iterator[Reference]:
    """The uninterrupted run the resumed ones must equal (it trains while they do)."""
    ref = Reference(forks, tmp_path_factory.mktemp("reference"))
    yield ref
    ref.stop()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_killed_during_an_upload_then_resumed_in_a_new_process_equals_an_uninterrupted_run(
    tmp_path: Path,
    moto: MotoServer,
    forks: ForkServer,
    reference: Reference,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Epochs 1-2 are checkpointed on S3; a SIGKILL while epoch 3's checkpoint is half uploaded leaves ``latest`` at
    epoch 2;
    a new process resumes from the bucket (background uploads this time) and ends bitwise equal to a 4-epoch run."""
    bucket = moto.bucket("killed")
    url = f"s3://{bucket}/run"
    args = ["--out-dir", url, "--endpoint", moto.endpoint, "--epochs", "4"]
    p = _start(forks, tmp_path, "work", *args, "--hang-in-upload", "epoch_3.pth", stderr_to_stdout=True)
    assert p.stdout is not None
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            if line.startswith("uploading epoch_3.pth"):
                p.send_signal(signal.SIGKILL)
                break
    finally:
        p.kill()
        p.wait(timeout=60)
    assert any(line.startswith("uploading") for line in lines), "".join(lines[-40:])
    fs = moto.fs()
    names = sorted(Path(f).name for f in fs.ls(f"{bucket}/run"))
    assert names == ["epoch_1.pth", "epoch_2.pth", "latest"]  # the half-sent epoch_3.pth is not visible
    assert fs.cat(f"{bucket}/run/latest") == b"epoch_2.pth\n"
    assert fs.list_multipart_uploads(bucket)  # the killed upload is still open on the server: nothing completed it
    assert fs.cat(f"{bucket}/run-logs/run/metrics.jsonl")  # the logs were copied at the checkpoints

    out, _ = _train(forks, tmp_path, "work", *args, "--async-save")
    assert "start 20" in out  # resumed at the end of epoch 2, from the bucket
    _assert_equal(_weights(tmp_path / "work"), reference.weights())
    assert sorted(Path(f).name for f in fs.ls(f"{bucket}/run", refresh=True)) == [
        "epoch_3.pth",
        "epoch_4.pth",
        "latest",
    ]  # keep 2
    assert fs.cat(f"{bucket}/run/latest") == b"epoch_4.pth\n"
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    assert load_file(f"s3://{bucket}/run/epoch_4.pth")["progress"]["epoch"] == 4
    records = fs.cat(f"{bucket}/run-logs/run/metrics.jsonl").decode().splitlines()
    assert any('"epoch": 4' in r for r in records)  # copied again at the end of the run
    _no_local_url_folder(tmp_path)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sharded_fsdp_checkpoints_on_s3_skip_an_incomplete_one_and_resume_equal(
    tmp_path: Path,
    moto: MotoServer,
    forks: ForkServer,
    reference: Reference,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DCP on S3 (async: local copy then upload; sync: FsspecWriter): a folder without ``.metadata`` is incomplete,
    skipped; resume from the one before."""
    bucket = moto.bucket("sharded")
    args = ["--out-dir", f"s3://{bucket}/run", "--endpoint", moto.endpoint, "--strategy", "fsdp"]
    _train(
        forks, tmp_path, "work", *args, "--epochs", "2", "--async-save"
    )  # in the background: written locally, then uploaded
    fs = moto.fs()
    assert fs.cat(f"{bucket}/run/latest") == b"epoch_2.dcp\n"
    assert {Path(f).name for f in fs.find(f"{bucket}/run/epoch_2.dcp")} >= {".metadata", "trainer_state.pth"}
    staged = tmp_path / "work" / "checkpoints_unuploaded"
    assert not staged.exists() or not any(staged.iterdir())  # the local copies are gone once uploaded
    # one process reads the sharded checkpoint whole, from the bucket (no process group)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    full = Strategy("cpu").load_checkpoint(f"s3://{bucket}/run/epoch_2.dcp")
    _assert_equal(full["model"], _weights(tmp_path / "work"))
    fs.rm(f"{bucket}/run/epoch_2.dcp/.metadata")  # as if the run died before DCP wrote its index
    out, err = _train(forks, tmp_path, "work", *args, "--epochs", "4")
    assert "Skipping checkpoint 's3://sharded/run/epoch_2.dcp'" in err and "start 10" in out
    # one FSDP process trains as the single-device reference
    _assert_equal(_weights(tmp_path / "work"), reference.weights())
    assert fs.cat(f"{bucket}/run/latest") == b"epoch_4.dcp\n"
    _no_local_url_folder(tmp_path)


# --------------------------------------------------------------------------- in this process


def _trainer(
    work: Path,
    out_dir: str,
    options: dict[str, Any] | None = None,
    keep: int = -1,
    logs: str | None = None,
    async_save: bool = False,
    **kw: Any,
) -> tw.Trainer:
    from conftest import make_trainer

    ckpt = dict(
        out_dir=out_dir, max_keep_ckpts=keep, async_save=async_save, **({"storage_options": options} if options else {})
    )
    kw.setdefault("train_cfg", dict(by_epoch=True, max_epochs=2))
    hooks: dict[str, Any] = dict(checkpoint=ckpt, **({"logger": dict(out_dir=logs)} if logs else {}))
    return make_trainer(work, default_hooks=hooks, **kw)


def _fast(endpoint: str) -> dict[str, Any]:
    """s3fs options for a test: one try per request, a short connect timeout (a dead endpoint fails in a second, not
    after botocore's retries)."""
    return dict(
        client_kwargs=dict(endpoint_url=endpoint),
        config_kwargs=dict(retries=dict(max_attempts=1), connect_timeout=1, read_timeout=5),
    )


def test_load_from_an_s3_url_and_no_local_folder_named_after_it(
    tmp_path: Path, moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    bucket = moto.bucket("weights")
    t = _trainer(tmp_path / "a", f"s3://{bucket}/run", dict(client_kwargs=dict(endpoint_url=moto.endpoint)))
    t.train()
    t.close()
    saved = load_file(t.checkpoints.ckpt_dir / "epoch_2.pth")[
        "model"
    ]  # the trainer's folder carries its store (endpoint, options)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)  # a plain URL: credentials and endpoint from the environment
    t2 = _trainer(
        tmp_path / "b",
        f"s3://{bucket}/other",
        load_from=f"s3://{bucket}/run/epoch_2.pth",
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.0)),
        train_cfg=dict(by_epoch=True, max_epochs=1),
    )
    t2.train()
    t2.close()
    _assert_equal(dict(t2.unwrapped_model.state_dict()), saved)
    assert "epoch_2.pth" not in saved and not (tmp_path / "s3:").exists()
    _no_local_url_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"s3://{bucket}/run/epoch_9.pth"):
        load_file(f"s3://{bucket}/run/epoch_9.pth")


def test_a_missing_bucket_fails_at_start_naming_the_url_and_creates_nothing(tmp_path: Path, moto: MotoServer) -> None:
    with pytest.raises(OSError, match=r"s3://no-such-bucket/run .*the bucket does not exist.*Create it"):
        _trainer(tmp_path / "work", "s3://no-such-bucket/run", dict(client_kwargs=dict(endpoint_url=moto.endpoint)))
    assert not (tmp_path / "work").exists()


def test_wrong_credentials_fail_at_start_naming_the_url(tmp_path: Path, spares: Spares) -> None:
    server = spares.take(auth=True)  # accepts only access keys it issued: "testing" is not one
    try:
        with pytest.raises(OSError, match=r"s3://locked/run .*access denied.*AWS_ACCESS_KEY_ID"):
            _trainer(tmp_path / "work", "s3://locked/run", dict(client_kwargs=dict(endpoint_url=server.endpoint)))
    finally:
        server.stop()
    assert not (tmp_path / "work").exists()


def test_an_unreachable_endpoint_fails_at_start_naming_the_url(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(OSError, match=rf"s3://bucket/run .*cannot reach the storage endpoint {dead}.*endpoint_url"):
        _trainer(tmp_path / "work", "s3://bucket/run", _fast(dead))
    assert not (tmp_path / "work").exists()


def test_resuming_from_a_url_outside_out_dir_names_it_and_where_its_settings_come_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    monkeypatch.setenv(
        "AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}"
    )  # nothing listens: the out_dir's storage_options do not apply here
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    # fsspec reuses a filesystem built with the same (empty) options by an earlier test
    s3fs.S3FileSystem.clear_instance_cache()
    t = _trainer(tmp_path / "work", str(tmp_path / "ckpts"), resume="s3://elsewhere/run/epoch_2.pth")
    with pytest.raises(
        OSError,
        match=r"Cannot read s3://elsewhere/run/epoch_2.pth\S*: cannot reach the storage endpoint.*A URL outside the "
        r"CheckpointHook's out_dir does not get its storage_options",
    ):
        t.train()
    t.close()


def test_a_missing_fsspec_backend_names_the_extra_to_install(tmp_path: Path) -> None:
    """fsspec missing: the ``fsspec`` extra; s3fs missing for s3://: the ``s3`` extra (a fresh process that cannot
    import them)."""
    code = (
        "import sys; sys.modules['fsspec'] = None\n"
        "from trainwright.hooks import CheckpointHook\n"
        "try:\n    CheckpointHook(out_dir='memory://bucket/run')\nexcept ImportError as e:\n    print(e)\n"
        "del sys.modules['fsspec']; sys.modules['s3fs'] = None\n"
        "try:\n    CheckpointHook(out_dir='s3://bucket/run')\nexcept ImportError as e:\n    print(e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    first, second = p.stdout.strip().splitlines()
    assert (
        "memory://bucket/run" in first
        and "fsspec, which is not installed" in first
        and "pip install 'trainwright[fsspec]'" in first
    ), p.stdout + p.stderr
    assert "s3://bucket/run" in second and "pip install 'trainwright[s3]'" in second, p.stdout + p.stderr


class AfterEpoch1(tw.Hook):
    """Calls ``fault()`` once the first epoch (and its checkpoint) is done: the server goes away, or stalls, mid-run."""

    def __init__(self, fault: Any) -> None:
        self.fault = fault

    def before_train_epoch(self, trainer: Any) -> None:
        if trainer.progress.epoch == 1:
            self.fault()


def test_the_endpoint_going_away_mid_run_keeps_the_checkpoints_locally_and_training_goes_on(
    tmp_path: Path, spares: Spares
) -> None:
    server = spares.take()
    bucket = server.bucket("flaky")

    try:
        t = _trainer(
            tmp_path / "work",
            f"s3://{bucket}/run",
            _fast(server.endpoint),
            train_cfg=dict(by_epoch=True, max_epochs=3),
            custom_hooks=[AfterEpoch1(server.stop)],
        )
        with pytest.warns(
            UserWarning,
            match=r"Could not upload checkpoint s3://flaky/run/epoch_2.pth .*kept it locally as "
            r".*checkpoints_unuploaded/epoch_2.pth",
        ):
            t.train()
        t.close()
    finally:
        server.stop()
    assert t.progress.epoch == 3  # training went on
    kept = tmp_path / "work" / "checkpoints_unuploaded"
    assert sorted(p.name for p in kept.iterdir()) == ["epoch_2.pth", "epoch_3.pth"]
    assert load_file(kept / "epoch_3.pth")["progress"]["epoch"] == 3
    # the kept file is a checkpoint like any other: a run resumes from it
    t2 = _trainer(
        tmp_path / "work2",
        str(tmp_path / "local"),
        resume=str(kept / "epoch_3.pth"),
        train_cfg=dict(by_epoch=True, max_epochs=3),
    )
    t2.train()
    _assert_equal(dict(t2.unwrapped_model.state_dict()), dict(t.unwrapped_model.state_dict()))
    t2.close()


@pytest.mark.slow
def test_the_endpoint_going_away_keeps_a_sharded_checkpoint_written_in_place_locally(
    tmp_path: Path, spares: Spares
) -> None:
    """FSDP, synchronous: the directory written in place on the URL keeps failing (the store's tries); it is written
    into the fallback folder instead and kept by the same code as a single file (``remote_io.keep_locally``)."""
    server = spares.take()
    bucket = server.bucket("flaky-sync")
    try:
        t = _trainer(
            tmp_path / "work",
            f"s3://{bucket}/run",
            _fast(server.endpoint),
            strategy="fsdp",
            train_cfg=dict(by_epoch=True, max_epochs=2),
            custom_hooks=[AfterEpoch1(server.stop)],
        )
        with pytest.warns(
            UserWarning,
            match=r"Could not upload checkpoint s3://flaky-sync/run/epoch_2.dcp .*kept it locally as "
            r".*checkpoints_unuploaded/epoch_2.dcp.*resume=",
        ):
            t.train()
        t.close()
    finally:
        server.stop()
    assert t.progress.epoch == 2  # training went on to its end
    kept = tmp_path / "work" / "checkpoints_unuploaded"
    assert sorted(p.name for p in kept.iterdir()) == ["epoch_2.dcp"]  # complete, no staging folder left
    assert (kept / "epoch_2.dcp" / ".metadata").is_file()


def test_a_stalled_endpoint_mid_run_keeps_the_checkpoints_locally_within_the_deadline(
    tmp_path: Path, spares: Spares
) -> None:
    """SIGSTOP stands for a stalled network: s3fs's upload would wait forever; the attempt deadline makes it fail and
    fall back."""
    server = spares.take()
    bucket = server.bucket("stalled")

    options = {**_fast(server.endpoint), "attempt_timeout_s": 1.0}
    try:
        t = _trainer(
            tmp_path / "work",
            f"s3://{bucket}/run",
            options,
            train_cfg=dict(by_epoch=True, max_epochs=2),
            custom_hooks=[AfterEpoch1(lambda: server.proc.send_signal(signal.SIGSTOP))],
        )
        started = time.monotonic()
        with pytest.warns(
            UserWarning, match=r"Could not upload checkpoint s3://stalled/run/epoch_2.pth .*kept it locally"
        ):
            t.train()
        took = time.monotonic() - started
        t.close()
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.stop()
    assert t.progress.epoch == 2 and took < 60, took  # 3 attempts of about 1 s each, not a hang
    kept = tmp_path / "work" / "checkpoints_unuploaded"
    assert load_file(kept / "epoch_2.pth")["progress"]["epoch"] == 2
    # resume=True in the same work_dir prefers the kept copy, newer than anything in the bucket (an empty one on a new
    # server)
    again = spares.take()
    try:
        again.bucket("stalled")
        t2 = _trainer(
            tmp_path / "work",
            f"s3://{bucket}/run",
            _fast(again.endpoint),
            resume=True,
            train_cfg=dict(by_epoch=True, max_epochs=3),
        )
        with pytest.warns(
            UserWarning,
            match=r"resume=True: resuming from .*checkpoints_unuploaded/epoch_2.pth, "
            r"kept locally when its upload failed",
        ):
            t2.train()
        assert t2.checkpoints.restored is not None and t2.checkpoints.restored[1] == 20 and t2.progress.epoch == 3
        t2.close()
    finally:
        again.stop()


@pytest.mark.slow
def test_a_failed_background_sharded_upload_keeps_a_complete_local_copy_that_resumes(
    tmp_path: Path, spares: Spares
) -> None:
    """FSDP + async_save on S3: the directory is written locally, then uploaded; when the endpoint is gone, the local
    copy is kept whole."""
    server = spares.take()
    bucket = server.bucket("flaky-dcp")

    uploaded: set[str] = set()

    class StopServerAfterEpoch1(tw.Hook):
        def before_train_epoch(self, trainer: Any) -> None:
            if trainer.progress.epoch == 1:
                trainer.strategy.wait_for_checkpoint()  # epoch_1's upload finishes while the server is up
                uploaded.update(Path(f).name for f in server.fs().find(f"{bucket}/run/epoch_1.dcp"))
                server.stop()

    try:
        t = _trainer(
            tmp_path / "work",
            f"s3://{bucket}/run",
            _fast(server.endpoint),
            async_save=True,
            strategy="fsdp",
            train_cfg=dict(by_epoch=True, max_epochs=3),
            custom_hooks=[StopServerAfterEpoch1()],
        )
        with pytest.warns(
            UserWarning,
            match=r"Could not upload checkpoint s3://flaky-dcp/run/epoch_2.dcp .*kept it locally as "
            r".*checkpoints_unuploaded/epoch_2.dcp",
        ):
            t.train()
        final = {k: v.clone() for k, v in t.unwrapped_model.state_dict().items()}
        t.close()
    finally:
        server.stop()
    assert t.progress.epoch == 3  # training went on
    assert {".metadata", "trainer_state.pth"} <= uploaded  # the upload before the fault is complete
    kept = tmp_path / "work" / "checkpoints_unuploaded"
    assert sorted(p.name for p in kept.iterdir()) == [
        "epoch_2.dcp",
        "epoch_3.dcp",
    ]  # complete copies, no staging folder left
    assert (kept / "epoch_3.dcp" / ".metadata").is_file()
    # the kept folder is a checkpoint like any other: a run resumes from it and ends where the first one did
    t2 = _trainer(
        tmp_path / "work2",
        str(tmp_path / "local"),
        resume=str(kept / "epoch_3.dcp"),
        strategy="fsdp",
        train_cfg=dict(by_epoch=True, max_epochs=3),
    )
    t2.train()
    _assert_equal(dict(t2.unwrapped_model.state_dict()), final)
    t2.close()


def test_memory_url_round_trip_with_keep_k_and_resume(tmp_path: Path) -> None:
    """memory:// (fsspec's in-process store): keep-k deletes after the new ``latest``; resume=True finds the newest
    there; logs are copied."""
    import fsspec

    t = _trainer(
        tmp_path, "memory://round/trip", keep=2, logs="memory://round/logs", train_cfg=dict(by_epoch=True, max_epochs=3)
    )
    t.train()
    t.close()
    fs = fsspec.filesystem("memory")
    assert sorted(Path(f).name for f in fs.ls("/round/trip", detail=False)) == ["epoch_2.pth", "epoch_3.pth", "latest"]
    copied = fs.cat(f"memory://round/logs/{t.run_dir.name}/metrics.jsonl")
    assert (
        copied == (t.run_dir / "metrics.jsonl").read_bytes() and b'"epoch": 3' in copied
    )  # the end of the run is in the copy
    fs.pipe_file(
        "memory://round/trip/epoch_4.pth", b"not a checkpoint"
    )  # a corrupt newest one, named by latest, is skipped
    fs.pipe_file("memory://round/trip/latest", b"epoch_4.pth\n")
    t2 = _trainer(tmp_path, "memory://round/trip", train_cfg=dict(by_epoch=True, max_epochs=4), resume=True)
    with pytest.warns(UserWarning, match="Skipping checkpoint 'memory://round/trip/epoch_4.pth'"):
        t2.train()
    t2.close()
    assert t2.checkpoints.restored is not None and str(t2.checkpoints.restored[0]) == "memory://round/trip/epoch_3.pth"
    _no_local_url_folder(tmp_path)
    for f in fs.ls("/round/trip", detail=False):  # nothing loads: the advice is about the out_dir, not the work_dir
        if f.endswith(".pth"):
            fs.pipe_file(f"memory://{f}", b"not a checkpoint")
    t3 = _trainer(tmp_path, "memory://round/trip", train_cfg=dict(by_epoch=True, max_epochs=4), resume=True)
    with (
        pytest.warns(UserWarning),
        pytest.raises(tw.checkpoint.CheckpointError, match=r"start a fresh run with another CheckpointHook out_dir"),
    ):
        t3.train()
    t3.close()
