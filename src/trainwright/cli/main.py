"""Argument parsing and error reporting of the ``trainwright`` command.

Errors a user makes (a missing or broken config, a bad override, an unknown ``type``, wrong
arguments for a component) are printed as one short message and exit with status 2;
``--debug`` shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from trainwright.registry import ConfigError
from trainwright.version import __version__

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``trainwright`` and its sub-commands."""
    parser = argparse.ArgumentParser(
        prog="trainwright", description="Train, evaluate and compare PyTorch models from config files."
    )
    parser.add_argument("--version", action="version", version=f"trainwright {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("config", metavar="CONFIG", help="config file (.py, .yaml, .yml or .json)")
    common.add_argument(
        "--work-dir",
        help="where checkpoints and run folders go (default: the config's work_dir, else work_dirs/<config name>)",
    )
    common.add_argument(
        "--cfg-options",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="override config keys, e.g. optim_wrapper.optimizer.lr=0.01 train_cfg.max_epochs=5",
    )
    common.add_argument(
        "--launcher",
        choices=["none", "pytorch", "slurm", "mpi"],
        default=None,
        help="how the processes were started (default: detected)",
    )
    common.add_argument("--precision", help="'32', 'bf16-mixed' or '16-mixed' (overrides the config)")
    common.add_argument("--seed", type=int, help="random seed (overrides randomness.seed)")
    common.add_argument("--debug", action="store_true", help="show full tracebacks")

    train = sub.add_parser(
        "train", parents=[common], help="train a model from a config", description="Train a model from a config file."
    )
    train.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=None,
        metavar="PATH",
        help="resume from PATH, or (no PATH) from the latest checkpoint of the work dir",
    )
    train.add_argument(
        "--load-from", metavar="PATH", help="initialise the model from these weights (no optimizer state)"
    )
    train.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="start N processes on this machine through torch.distributed.run (torchrun --standalone "
        "--nproc_per_node=N -m trainwright train ... --launcher pytorch); "
        "default 1, or PET_NPROC_PER_NODE in a Kubernetes PyTorchJob",
    )
    # several machines (docs/clusters.md): one `trainwright train --nproc N` per machine, static rendezvous at node 0's
    # HOST:PORT
    train.add_argument(
        "--nnodes",
        type=int,
        default=None,
        metavar="N",
        help="machines in the run, one launch each (default 1, or what SLURM / a PyTorchJob says)",
    )
    train.add_argument(
        "--node-rank",
        type=int,
        default=None,
        metavar="R",
        help="this machine's index, 0..nnodes-1 (default: SLURM_NODEID, PET_NODE_RANK)",
    )
    train.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="node 0's address and a free port there (default: MASTER_ADDR:MASTER_PORT, "
        "PET_MASTER_ADDR:PET_MASTER_PORT, SLURM's first node:29500)",
    )
    for name, what in (("test", "test"), ("val", "validation")):
        p = sub.add_parser(
            name,
            parents=[common],
            help=f"one {what} pass over {name}_dataloader",
            description=f"Run one {what} pass and print the metrics as JSON.",
        )
        p.add_argument(
            "--checkpoint", required=name == "test", metavar="PATH", help="the checkpoint whose weights are evaluated"
        )

    plot = sub.add_parser(
        "plot",
        help="plot loss / metric / lr curves of runs",
        description="Plot curves from metrics.jsonl; several work dirs are overlaid.",
    )
    plot.add_argument(
        "work_dirs", nargs="+", metavar="WORK_DIR", help="a work dir, a run folder or a metrics.jsonl file"
    )
    plot.add_argument("--keys", nargs="+", metavar="KEY", help="what to plot (default: loss, the val/ metrics and lr)")
    plot.add_argument("--out", default="curves.png", metavar="PNG", help="the image to write (default: curves.png)")
    plot.add_argument("--debug", action="store_true", help="show full tracebacks")

    from trainwright.cli.sweep import add_sweep_parser

    add_sweep_parser(sub)
    from trainwright.cli.tune import add_tune_lr_parser

    add_tune_lr_parser(sub, common)

    from trainwright.cli.ckpt import add_ckpt_parser

    add_ckpt_parser(sub)
    from trainwright.cli.verify_resume import add_verify_resume_parser

    add_verify_resume_parser(sub)

    env = sub.add_parser("env", help="show the environment (python, torch, CUDA, devices, backends, extras)")
    env.add_argument("--debug", action="store_true", help="show full tracebacks")
    env.add_argument(
        "--full", action="store_true", help="import torch and ask it (devices, CUDA / MPS, threads, backends)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``trainwright`` command; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.command in ("train", "test", "val"):
            from trainwright.cli.run import run_command

            return run_command(args, argv)
        if args.command == "plot":
            from trainwright.cli.plot import plot_runs

            out = plot_runs(args.work_dirs, args.keys, args.out)
            print(f"wrote {out}")
            return 0
        if args.command == "sweep":
            from trainwright.cli.sweep import sweep_command

            return sweep_command(args)
        if args.command == "ckpt":
            from trainwright.cli.ckpt import ckpt_command

            return ckpt_command(args)
        if args.command == "verify-resume":
            from trainwright.cli.verify_resume import verify_resume_command

            return verify_resume_command(args)
        if args.command == "tune-lr":
            from trainwright.cli.tune import tune_lr_command

            return tune_lr_command(args)
        from trainwright.cli.env import collect_env_info

        print(collect_env_info(full=args.full))
        return 0
    except ConfigError as e:
        if args.debug:
            raise
        print(f"trainwright {args.command}: error: {e}", file=sys.stderr)
        print("(run again with --debug for the full traceback)", file=sys.stderr)
        return EXIT_USAGE
