"""``trainwright tune-lr``: build the trainer from a config, run the learning-rate range test, print the suggestion,
draw the curve."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainwright.registry import ConfigError


def add_tune_lr_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add ``tune-lr`` to the ``trainwright`` sub-commands (``common``: the config / work-dir / cfg-options flags)."""
    p = sub.add_parser(
        "tune-lr",
        parents=[common],
        help="find a learning rate: the lr range test of a config (prints the suggestion, draws the curve)",
        description="Ramp the learning rate over real training steps of the config, print the suggested lr and "
        "write the loss curve as a PNG. "
        "Nothing is trained or saved: the model and optimizer are put back afterwards.",
    )
    p.add_argument("--min-lr", type=float, default=1e-6, help="first learning rate of the ramp (default: 1e-6)")
    p.add_argument("--max-lr", type=float, default=1.0, help="last learning rate of the ramp (default: 1)")
    p.add_argument("--num-steps", type=int, default=100, help="optimizer updates of the test (default: 100)")
    p.add_argument("--mode", choices=["exp", "linear"], default="exp", help="exponential (default) or linear ramp")
    p.add_argument("--out", default="lr_find.png", metavar="PNG", help="the plot to write (default: lr_find.png)")


def tune_lr_command(args: argparse.Namespace) -> int:
    """Run ``trainwright tune-lr``; return the exit status."""
    from trainwright.cli.run import load_config
    from trainwright.trainer import Trainer
    from trainwright.tuning.lr_range import check_lr_args

    try:
        check_lr_args(args.min_lr, args.max_lr, args.num_steps, args.mode, 0.05, 4.0)
    except ValueError as e:
        raise ConfigError(f"{e} (--min-lr, --max-lr, --num-steps, --mode)") from e
    cfg = load_config(args)
    trainer = Trainer.from_config(cfg)
    try:
        result = trainer.find_lr(min_lr=args.min_lr, max_lr=args.max_lr, num_steps=args.num_steps, mode=args.mode)
        if trainer.strategy.is_main_process:
            out = result.plot(Path(args.out))
            lr = result.suggestion
            what = f"{len(result.lrs)} updates, lr {result.lrs[0]:.3g} to {result.lrs[-1]:.3g}" + (
                ", stopped early: the loss diverged" if result.stopped_early else ""
            )
            if lr is None:
                print(f"no suggestion: too few points ({what}); raise --num-steps or lower --max-lr")
            else:
                print(f"suggested lr: {lr:.4g} (steepest descent of the smoothed loss; {what})")
            print(f"wrote {out}")
    finally:
        trainer.close()
    return 0
