"""``trainwright train / test / val``: load the config, apply the command line, build the trainer, run.

``train --nproc N`` (and ``--nnodes``) hands over to ``torch.distributed.run`` in a child
process and stays as the launcher: SIGUSR1 / SIGTERM / SIGHUP sent to it go to the workers
(torchrun itself ignores SIGUSR1, which would otherwise kill it), so a SLURM ``--signal``
reaches the PreemptionHook whether it is sent to the launcher or to every process.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwright.config import Config
from trainwright.registry import ConfigError
from trainwright.utils.launcher import (
    DEFAULT_MASTER_PORT,
    NodeLayout,
    detect_launcher,
    is_launched_worker,
    resolve_nodes,
)

if TYPE_CHECKING:
    from trainwright.trainer import Trainer

_LAUNCH_HINT = (
    "start the processes with: torchrun --nproc_per_node=N -m trainwright train CONFIG --launcher pytorch (or "
    "trainwright train CONFIG --nproc N)"
)


def load_config(args: argparse.Namespace) -> Config:
    """The config file with ``--cfg-options`` and the other flags applied (flags win over ``--cfg-options``)."""
    cfg = Config.fromfile(args.config)
    cfg.merge_from_args(args.cfg_options)
    if args.work_dir:
        cfg.work_dir = args.work_dir
    elif not cfg.get("work_dir"):
        cfg.work_dir = str(Path("work_dirs") / Path(args.config).stem)
    if args.precision:
        cfg.precision = args.precision
    if args.seed is not None:
        cfg.randomness = {**(cfg.get("randomness") or {}), "seed": args.seed}
    if getattr(args, "resume", None) is not None:
        cfg.resume = args.resume
    if getattr(args, "load_from", None):
        cfg.load_from = args.load_from
    return cfg


def torchrun_argv(
    argv: Sequence[str], nproc: int, nnodes: int = 1, node_rank: int = 0, endpoint: str | None = None
) -> list[str]:
    """The command that hands ``trainwright train ...`` over to ``torch.distributed.run`` with ``nproc`` processes per
    node.

    ``--nproc``, ``--nnodes``, ``--node-rank``, ``--rdzv-endpoint`` and any ``--launcher`` are
    dropped from ``argv`` and ``--launcher pytorch`` is added. One node:
    ``python -m torch.distributed.run --standalone --nproc_per_node=N -m trainwright train CONFIG ... --launcher
    pytorch``;
    several: ``--nnodes=M --node-rank=R --master-addr=HOST --master-port=PORT`` (torchrun's static
    rendezvous: node R's processes are ranks ``R*N .. R*N+N-1``, node 0 hosts the store at HOST:PORT).
    """
    rest: list[str] = []
    skip = False
    dropped = ("--nproc", "--launcher", "--nnodes", "--node-rank", "--rdzv-endpoint")
    for tok in argv:
        if skip:
            skip = False
            continue
        if tok in dropped:
            skip = True
            continue
        if tok.startswith(tuple(f"{d}=" for d in dropped)):
            continue
        rest.append(tok)
    if nnodes == 1:
        where = ["--standalone"]
    else:
        if endpoint is None:
            raise ConfigError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (node 0's address)")
        host, port = split_endpoint(endpoint)
        where = [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={host}", f"--master-port={port}"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        f"--nproc_per_node={nproc}",
        "-m",
        "trainwright",
        *rest,
        "--launcher",
        "pytorch",
    ]


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``"host:port"`` → ``("host", port)`` (``"[::1]:29500"`` too); a clear error otherwise."""
    host, sep, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"--rdzv-endpoint {endpoint!r} is not HOST:PORT (node 0's address and a free port there, e.g. "
            "node001:29500)"
        )
    return host, int(port)


def launch_plan(args: argparse.Namespace, env: Any = None) -> tuple[int, int, int, str | None] | None:
    """``(nproc, nnodes, node_rank, endpoint)`` when ``train`` must start its processes through torchrun; None: train in
    this process.

    In this process: a worker that torchrun started, or one process on one node (a plain run,
    a task ``srun`` started, a pod of one process). Otherwise what the flags do not say comes
    from the job (:func:`trainwright.utils.launcher.resolve_nodes`: SLURM, a Kubernetes PyTorchJob).
    """
    env = os.environ if env is None else env
    if is_launched_worker(env):
        return None
    try:
        nodes: NodeLayout = resolve_nodes(env)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    nproc = args.nproc if args.nproc is not None else (nodes.nproc_per_node or 1)
    if nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {nproc}")
    if args.nnodes is not None and args.nnodes < 1:
        raise ConfigError(f"--nnodes must be at least 1, got {args.nnodes}")
    asked_nodes = args.nnodes is not None or args.node_rank is not None or args.rdzv_endpoint is not None
    if nproc == 1 and not asked_nodes and (nodes.source != "pytorchjob" or nodes.nproc_per_node is None):
        return (
            None  # one process here; srun / a PyTorchJob pod of one process each: the launcher's variables describe it
        )
    nnodes = args.nnodes if args.nnodes is not None else nodes.nnodes
    if nodes.source == "slurm" and args.nnodes is None and nodes.ntasks != nodes.nnodes:
        raise ConfigError(
            f"srun started {nodes.ntasks} tasks on {nodes.nnodes} nodes and each would start --nproc {nproc} "
            "processes: with --nproc start one task per node "
            f"(srun --ntasks-per-node=1 trainwright train ... --nproc {nproc}), or drop --nproc and let srun start "
            f"every process (srun --ntasks-per-node={nproc})"
        )
    if nnodes == 1:
        return nproc, 1, 0, None
    node_rank = args.node_rank if args.node_rank is not None else nodes.node_rank
    if node_rank is None:
        raise ConfigError(
            f"--nnodes {nnodes} needs --node-rank R (0 on the machine at --rdzv-endpoint, 1..{nnodes - 1} on the "
            "others)"
        )
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank {node_rank} is outside 0..{nnodes - 1} (--nnodes {nnodes})")
    endpoint = args.rdzv_endpoint
    if endpoint is None and nodes.master_addr:
        endpoint = f"{nodes.master_addr}:{nodes.master_port or DEFAULT_MASTER_PORT}"
    if endpoint is None:
        raise ConfigError(
            f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT: node 0's address and a free port there, the same on "
            "every node"
        )
    split_endpoint(endpoint)
    return nproc, nnodes, node_rank, endpoint


#: What the launcher passes on to the workers (SIGINT only when it did not come from the terminal, which signals
#: torchrun too).
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def worker_pids(launcher_pid: int) -> list[int]:
    """The processes whose parent is ``launcher_pid`` (torchrun's workers), from ``/proc``; empty where there is no
    ``/proc``."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat.rpartition(")")[2].split()  # the command name in parentheses may hold spaces
        if len(fields) > 1 and fields[1] == str(launcher_pid):
            found.append(int(name))
    return sorted(found)


def _from_terminal() -> bool:
    """Whether this process is in the terminal's foreground group (a Ctrl-C reached torchrun too)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def _ignore_sigusr1() -> None:
    signal.signal(
        signal.SIGUSR1, signal.SIG_IGN
    )  # kept across exec: torchrun (and its workers until their hook installs) survive it


def run_launcher(cmd: Sequence[str]) -> int:
    """Run ``torch.distributed.run`` (``cmd``) as a child and stay as the launcher; return its exit status.

    torchrun forwards SIGTERM / SIGINT / SIGHUP / SIGQUIT to its workers but dies of SIGUSR1,
    SLURM's usual early warning, and leaves them unsupervised. So the child starts with
    SIGUSR1 ignored (what SLURM sends to every process of a job step kills nothing), and this
    process sends the signals it gets (:data:`FORWARDED_SIGNALS`) to the workers, where the
    PreemptionHook saves a checkpoint (and under SLURM requeues the job). A copy that reaches
    a worker twice, from SLURM and from here, counts once there.
    """
    proc: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: Any) -> None:
        if proc is None or (signum == signal.SIGINT and _from_terminal()):
            return
        pids = worker_pids(proc.pid)
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        name = signal.Signals(signum).name
        print(
            f"trainwright: {name} forwarded to the workers {pids}"
            if pids
            else f"trainwright: {name} received, but torchrun has no workers (yet) to forward it to",
            file=sys.stderr,
            flush=True,
        )

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        proc = subprocess.Popen(list(cmd), preexec_fn=_ignore_sigusr1)  # noqa: PLW1509 - only a signal disposition, set before exec
        code = proc.wait()
    finally:
        for s, prev in previous.items():
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)
    return 128 - code if code < 0 else code


def _check_launcher(launcher: str | None) -> None:
    if launcher is None:
        return
    found = detect_launcher()
    if launcher != "none" and found != launcher:
        raise ConfigError(
            f"--launcher {launcher} but this process was not started by it (detected: {found}); {_LAUNCH_HINT}"
        )
    if launcher == "none" and found != "none":
        raise ConfigError(
            f"--launcher none but this process was started by a launcher ({found}); drop --launcher or pass --launcher "
            f"{found}"
        )


def run_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``train``, ``test`` or ``val``; return the exit status."""
    if args.command == "train":
        plan = launch_plan(args)
        if plan is not None:
            return run_launcher(torchrun_argv(argv, *plan))
    _check_launcher(args.launcher)
    cfg = load_config(args)
    from trainwright.trainer import Trainer  # torch loads here: a launcher or a config error never waits for it

    if args.command != "train":
        cfg.load_from = args.checkpoint or cfg.get("load_from")
        cfg.resume = False
        cfg.train_dataloader = None  # an evaluation pass needs neither the training data nor its loader
    trainer = Trainer.from_config(cfg)
    if args.command == "val" and not cfg.get("load_from"):
        trainer.logger.warning(
            f"trainwright val: no --checkpoint and no load_from in {args.config}: evaluating the model as the config "
            "builds it, with its "
            "initial (untrained) weights. Pass --checkpoint PATH (a checkpoint in the training run's "
            "work_dir/checkpoints/, or weights) or set "
            "load_from in the config to evaluate trained weights."
        )
    try:
        result = _run(trainer, args.command, cfg, args.debug)
    finally:
        trainer.close()
    if args.command != "train" and trainer.strategy.is_main_process:
        print(json.dumps(result))
    return 0


def _run(trainer: Trainer, command: str, cfg: Config, debug: bool) -> Any:
    try:
        if command == "train":
            trainer.train()
            return None
        return trainer.test() if command == "test" else trainer.val()
    except Exception as e:
        from trainwright.trainer.from_config import config_path_of

        # parts built when the run starts (optimizer, schedulers, train loader) fail here: name their config key
        path = config_path_of(cfg, e)
        if debug or (path is None and not _is_config_mistake(e)):
            raise
        where = f"Building {path!r} from the config failed" if path else f"{command} cannot run"
        raise ConfigError(f"{where}: {type(e).__name__}: {e}") from e


def _is_config_mistake(error: Exception) -> bool:
    """A missing part the message explains (``test() needs a test_dataloader``)."""
    return isinstance(error, (ValueError, KeyError)) and "() needs" in str(error)
