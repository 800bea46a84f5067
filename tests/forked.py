"""Script runs forked from one process that imported torch already, for tests that start many runs of a script.

A fresh ``python script.py`` spends seconds importing torch, then ``torch._dynamo`` and sympy
(the first optimizer imports them), before the script does anything; a test that kills and
resumes a run a dozen times pays that a dozen times. :class:`ForkServer` imports them once;
:meth:`ForkServer.start` forks a new process from it that runs the script as ``__main__``
with its own arguments, environment, working directory, stdout and stderr. The run is a
process of its own, like ``subprocess.Popen``'s: signals (``kill -9`` included) reach it
alone, its exit status is its own, and what it resumes comes from disk only. Only the
imports are shared; every run of a test starts from the same forked state, so a reference
run and the runs compared with it start alike.

How: the server (this file run as a script) gets each request, with the pipe ends for the
run's stdout, stderr and status, over a Unix socket; it forks a small waiter that forks the
run, reports the run's pid, waits for it and reports its exit status (``-N`` for signal N).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: What the server imports before it forks runs (``trainwright`` itself loads its parts on use).
PRELOAD = ("torch", "torch._dynamo", "trainwright")
#: How long a run's start may wait for the server (its imports take a minute on a loaded 2-core machine).
START_TIMEOUT_S = 300


class ForkServer:
    """A process with ``PRELOAD`` imported that forks script runs (``close()`` ends it; its runs go on)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        """``env``: the server's environment (torch reads ``OMP_NUM_THREADS`` at import: give the runs' value)."""
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        theirs.close()

    def start(
        self,
        script: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        stderr_to_stdout: bool = False,
    ) -> ForkedRun:
        """Run ``python script *args`` (a fork of the server) with ``env`` (default: this process's) in ``cwd``;
        stdout and stderr are pipes (one pipe, ``stdout``, with ``stderr_to_stdout``)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"the fork server ended ({self.proc.returncode}): see {self._log.name}")
        request = dict(script=str(script), args=args, env=dict(os.environ if env is None else env))
        return ForkedRun(self._sock, dict(request, cwd=str(cwd or os.getcwd())), stderr_to_stdout)

    def close(self) -> None:
        """End the server (runs already started are not touched: they are not its children)."""
        self._sock.close()
        self.proc.kill()
        self.proc.wait(timeout=30)
        self._log.close()


class ForkedRun:
    """One run: the subset of ``subprocess.Popen`` the tests use (text ``stdout`` / ``stderr`` pipes)."""

    def __init__(self, sock: socket.socket, request: dict[str, Any], stderr_to_stdout: bool = False) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = (None, os.dup(out_w)) if stderr_to_stdout else os.pipe()
        status_r, status_w = os.pipe()
        try:
            socket.send_fds(sock, [json.dumps(request).encode()], [out_w, err_w, status_w])
        finally:
            for fd in (out_w, err_w, status_w):
                os.close(fd)
        self.stdout = open(out_r)  # noqa: SIM115 - closed by communicate() or with the object
        self.stderr = None if err_r is None else open(err_r)  # noqa: SIM115
        self._status = status_r
        self._status_text = b""
        self.returncode: int | None = None
        started = self._read_status(timeout=START_TIMEOUT_S)  # the server may still be importing torch
        if not started:
            raise RuntimeError(f"the fork server did not start the run within {START_TIMEOUT_S} s (still importing?)")
        self.pid = int(started[0])

    def _read_status(self, timeout: float | None) -> list[str]:
        """The status lines so far (pid, then the exit status), waiting up to ``timeout`` for one more."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            lines = self._status_text.decode().splitlines()
            if self._status_text.endswith(b"\n") and (len(lines) == 2 or not hasattr(self, "pid")):
                return lines
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._status], [], [], left)[0]:
                return lines
            chunk = os.read(self._status, 64)
            if not chunk:
                raise RuntimeError("the fork server's waiter ended without the run's exit status")
            self._status_text += chunk

    def poll(self) -> int | None:
        return self.wait(timeout=0, _raise=False)

    def wait(self, timeout: float | None = None, _raise: bool = True) -> int | None:
        if self.returncode is None:
            lines = self._read_status(timeout)
            if len(lines) == 2:
                self.returncode = int(lines[1])
            elif _raise:
                raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, Any]:
        """Read stdout and stderr to their ends and wait for the exit, within ``timeout`` seconds in all."""
        deadline = None if timeout is None else time.monotonic() + timeout
        texts: dict[str, Any] = {"err": None}
        readers = [
            threading.Thread(target=lambda k=k, f=f: texts.__setitem__(k, f.read()), daemon=True)
            for k, f in (("out", self.stdout), ("err", self.stderr))
            if f is not None
        ]
        for r in readers:
            r.start()
        for r in readers:
            r.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if r.is_alive():
                raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.stdout.close()
        if self.stderr is not None:
            self.stderr.close()
        return texts["out"], texts["err"]

    def __del__(self) -> None:
        if hasattr(self, "_status"):
            os.close(self._status)


class BackgroundRun:
    """A run started now (beside the runs a test kills) whose end a test waits for later: :meth:`finish` waits once
    and checks it succeeded; :meth:`stop` kills it if nobody waited (a fixture's teardown)."""

    def __init__(self, run: ForkedRun, timeout_s: float = 240) -> None:
        self._run: ForkedRun | None = run
        self._timeout_s = timeout_s

    def finish(self) -> None:
        """Wait for the run's end (at the first call) and assert it exited with 0, showing its output if not."""
        if self._run is not None:
            run, self._run = self._run, None
            out, err = run.communicate(timeout=self._timeout_s)
            assert run.returncode == 0, f"run failed ({run.returncode}):\n{out[-2000:]}\n{err[-4000:]}"

    def stop(self) -> None:
        """Kill the run if it was never waited for."""
        if self._run is not None:
            run, self._run = self._run, None
            run.kill()
            run.communicate()


# ----------------------------------------------------------------------------------------------------- the server


def _run(request: dict[str, Any], out: int, err: int) -> None:
    """In the forked run: become ``python script *args`` and run the script as ``__main__`` (exits, never returns)."""
    import runpy
    import tempfile

    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in (devnull, out, err):
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # TMPDIR as the run's environment says
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=True, write_through=unbuffered)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    script = request["script"]
    sys.argv = [script, *request["args"]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)  # SystemExit (the script's too) ends the process as the interpreter ends a script: atexit, flush


def _serve(sock: socket.socket) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters are reaped by the kernel
    while True:
        msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
        if not msg:
            return
        request = json.loads(msg)
        out, err, status = fds
        if os.fork() == 0:  # the waiter
            sock.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            pid = os.fork()
            if pid == 0:
                os.close(status)
                _run(request, out, err)
            os.close(out)
            os.close(err)
            os.write(status, f"{pid}\n".encode())
            _, code = os.waitpid(pid, 0)
            os.write(status, f"{os.waitstatus_to_exitcode(code)}\n".encode())
            os._exit(0)
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    for name in PRELOAD:
        importlib.import_module(name)
    _serve(socket.socket(fileno=int(sys.argv[1])))
