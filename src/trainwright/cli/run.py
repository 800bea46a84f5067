"""``trainwright train / test / val``: load the config, apply the command line, build the trainer, run."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainwright.config import Config
from trainwright.dist import detect_launcher
from trainwright.registry import ConfigError
from trainwright.trainer import Trainer
from trainwright.trainer.from_config import config_path_of

_LAUNCH_HINT = "start the processes with: torchrun --nproc_per_node=N -m trainwright train CONFIG --launcher pytorch (or trainwright train CONFIG --nproc N)"


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


def torchrun_argv(argv: Sequence[str], nproc: int) -> list[str]:
    """The command that hands ``trainwright train ...`` over to ``torch.distributed.run`` with ``nproc`` processes.

    ``--nproc`` and any ``--launcher`` are dropped from ``argv`` and ``--launcher pytorch`` is
    added: ``python -m torch.distributed.run --standalone --nproc_per_node=N -m trainwright train CONFIG ... --launcher pytorch``.
    """
    rest: list[str] = []
    skip = False
    for tok in argv:
        if skip:
            skip = False
            continue
        if tok in ("--nproc", "--launcher"):
            skip = True
            continue
        if tok.startswith(("--nproc=", "--launcher=")):
            continue
        rest.append(tok)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "trainwright", *rest, "--launcher", "pytorch"]


def _check_launcher(launcher: str | None) -> None:
    if launcher is None:
        return
    found = detect_launcher()
    if launcher != "none" and found != launcher:
        raise ConfigError(f"--launcher {launcher} but this process was not started by it (detected: {found}); {_LAUNCH_HINT}")
    if launcher == "none" and found != "none":
        raise ConfigError(f"--launcher none but this process was started by a launcher ({found}); drop --launcher or pass --launcher {found}")


def run_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``train``, ``test`` or ``val``; return the exit status."""
    if args.command == "train":
        if args.nproc < 1:
            raise ConfigError(f"--nproc must be at least 1, got {args.nproc}")
        if args.nproc > 1 and detect_launcher() == "none":
            return subprocess.run(torchrun_argv(argv, args.nproc), check=False).returncode
    _check_launcher(args.launcher)
    cfg = load_config(args)
    if args.command != "train":
        cfg.load_from = args.checkpoint or cfg.get("load_from")
        cfg.resume = False
        cfg.train_dataloader = None  # an evaluation pass needs neither the training data nor its loader
    trainer = Trainer.from_config(cfg)
    if args.command == "val" and not cfg.get("load_from"):
        trainer.logger.warning(
            f"trainwright val: no --checkpoint and no load_from in {args.config}: evaluating the model as the config builds it, with its "
            "initial (untrained) weights. Pass --checkpoint PATH (a checkpoint in the training run's work_dir/checkpoints/, or weights) or set "
            "load_from in the config to evaluate trained weights."
        )
    try:
        result = _run(trainer, args.command, cfg, args.debug)
    finally:
        trainer.close()
    if args.command != "train" and trainer.is_main_process:
        print(json.dumps(result))
    return 0


def _run(trainer: Trainer, command: str, cfg: Config, debug: bool) -> Any:
    try:
        if command == "train":
            trainer.train()
            return None
        return trainer.test() if command == "test" else trainer.val()
    except Exception as e:
        # parts built when the run starts (optimizer, schedulers, train loader) fail here: name their config key
        path = config_path_of(cfg, e)
        if debug or (path is None and not _is_config_mistake(e)):
            raise
        where = f"Building {path!r} from the config failed" if path else f"{command} cannot run"
        raise ConfigError(f"{where}: {type(e).__name__}: {e}") from e


def _is_config_mistake(error: Exception) -> bool:
    """A missing part the message explains (``test() needs a test_dataloader``)."""
    return isinstance(error, (ValueError, KeyError)) and "() needs" in str(error)
