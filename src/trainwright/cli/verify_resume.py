"""``trainwright verify-resume CONFIG``: is resuming this config bitwise the same as never stopping?

The command calls :func:`trainwright.verify.verify_resume` and prints its table; exit status 0
when every check is equal, 1 when one differs (or a run failed), 2 on a usage error. Run as
``python -m trainwright.cli.verify_resume SPEC.json``, this module is the worker of one run
segment: it builds the trainer from the config, adds the probe and trains.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_DIFFERS = 1


def add_verify_resume_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``verify-resume`` to ``sub`` (the ``trainwright`` sub-parsers)."""
    p = sub.add_parser(
        "verify-resume",
        help="check that resuming a config's training is bitwise the same as never stopping",
        description="Train CONFIG N steps uninterrupted, then again stopping and restarting in a fresh process at "
        "each K (resume from the checkpoint saved at the stop); compare the batches, losses, validation metrics, "
        "parameters, optimizer "
        "and scheduler state, random streams and data position bitwise. Exit status 0: all equal; 1: a difference "
        "(the first one is named); 2: a usage error.",
    )
    p.add_argument("config", metavar="CONFIG", help="config file (.py, .yaml, .yml or .json)")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="steps of each run (default: 2 epochs when that is at most 200 steps, else 40; at most the config's)",
    )
    p.add_argument(
        "--at",
        type=int,
        nargs="+",
        default=None,
        metavar="K",
        help="stop and restart after these iterations (default: inside epoch 1, inside an accumulation window when "
        "the config accumulates, at epoch 1's last batch; two restarts at least)",
    )
    p.add_argument("--nproc", type=int, default=1, metavar="P", help="processes per run (torch.distributed.run)")
    p.add_argument("--work-dir", default=None, help="an empty folder for the runs (default: a new temporary folder)")
    p.add_argument(
        "--cfg-options", nargs="+", default=[], metavar="KEY=VALUE", help="override config keys, as for train"
    )
    p.add_argument("--timeout", type=float, default=3600.0, metavar="S", help="seconds each process may take")
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    return p


def verify_resume_command(args: argparse.Namespace) -> int:
    """Run ``verify-resume``; print the table; return 0 (all equal) or 1 (a difference, or a run failed)."""
    from trainwright.config import Config
    from trainwright.verify import VerifyRunError, verify_resume

    Config.fromfile(args.config).merge_from_args(args.cfg_options)  # a broken config or option: a usage error now

    def echo(line: str) -> None:
        print(f"verify-resume: {line}", file=sys.stderr, flush=True)

    try:
        report = verify_resume(
            args.config,
            steps=args.steps,
            at=args.at,
            nproc=args.nproc,
            work_dir=args.work_dir,
            cfg_options=args.cfg_options,
            timeout_s=args.timeout,
            echo=echo,
        )
    except VerifyRunError as e:
        if args.debug:
            raise
        print(f"trainwright verify-resume: {e}", file=sys.stderr)
        return EXIT_DIFFERS
    print(report.table())
    return 0 if report.ok else EXIT_DIFFERS


def run_worker(spec_path: str | Path) -> None:
    """Train one segment of a verification as ``spec_path`` (JSON, written by the verifier) says."""
    from trainwright.config import Config
    from trainwright.trainer import Trainer
    from trainwright.verify.probe import ResumeProbe, record_file

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    cfg = Config.fromfile(spec["config"])
    cfg.merge_from_args(spec["cfg_options"])
    cfg.work_dir = spec["work_dir"]
    cfg.resume = bool(spec["resume"])
    randomness = dict(cfg.get("randomness") or {})
    if randomness.get("seed") is None:  # two runs of an unseeded config differ from the start: compare seeded ones
        cfg.randomness = {**randomness, "seed": 0}
        print("verify-resume: the config names no seed; these runs use randomness.seed=0", flush=True)
    trainer = Trainer.from_config(cfg)
    record = record_file(spec["records"], int(spec["segment"]), trainer.strategy.rank)
    trainer.register_hook(ResumeProbe(record, stop_at=spec["stop_at"], epochs=int(spec["epochs"])))
    try:
        trainer.train()
    finally:
        trainer.close()


if __name__ == "__main__":
    run_worker(sys.argv[1])
