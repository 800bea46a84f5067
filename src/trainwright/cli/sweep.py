"""``trainwright sweep``: a hyper-parameter sweep of a config (the arguments of
:func:`trainwright.sweeps.run_sweep`)."""

from __future__ import annotations

import argparse

from trainwright.config import Config


def add_sweep_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``sweep`` sub-command to ``trainwright``'s parser."""
    p = sub.add_parser(
        "sweep",
        help="search hyper-parameters with Optuna: one training run per trial (needs trainwright[optuna])",
        description="Train the config once per trial with the trial's values of the --param keys; prune hopeless "
        "trials at their validations; continue an interrupted sweep from its storage; write results.csv and the "
        "best config.",
    )
    p.add_argument("config", metavar="CONFIG", help="config file (.py, .yaml, .yml or .json)")
    p.add_argument(
        "--trials",
        type=int,
        required=True,
        metavar="N",
        help="how many trials should have finished (complete, pruned or diverged); a continued sweep counts the "
        "earlier ones",
    )
    p.add_argument(
        "--param",
        action="append",
        required=True,
        metavar="KEY=DIST",
        help="a config key and its distribution: loguniform:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH[:log] or "
        "choice:A,B,C "
        "(e.g. optim_wrapper.optimizer.lr=loguniform:1e-4:1e-1); repeat for more keys",
    )
    p.add_argument("--metric", required=True, help="the validation metric to optimise, e.g. val/acc")
    p.add_argument(
        "--direction",
        choices=["max", "min"],
        default=None,
        help="whether higher or lower is better (default: from the metric's name: acc -> max, loss -> min)",
    )
    p.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="Optuna storage, e.g. sqlite:///sweep.db (default: sqlite:///WORK_DIR/sweep.db); the same storage and "
        "study name continue a sweep",
    )
    p.add_argument(
        "--study-name", default=None, metavar="NAME", help="the study in the storage (default: the config file's name)"
    )
    p.add_argument(
        "--pruner",
        choices=["median", "none"],
        default="median",
        help="median (default): stop a trial worse than the median of earlier trials at the same validation; none: "
        "never",
    )
    p.add_argument(
        "--startup-trials",
        type=int,
        default=5,
        metavar="N",
        help="trials that run to the end before the median pruner prunes any (default 5)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the sampler (the trials' training is seeded by the config's randomness)",
    )
    p.add_argument(
        "--work-dir",
        default=None,
        metavar="DIR",
        help="where trial_<n>/, results.csv and the best config go (default: <config work_dir>/sweep_<study name>)",
    )
    p.add_argument(
        "--cfg-options",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="override config keys for every trial, e.g. train_cfg.max_epochs=5",
    )
    p.add_argument("--debug", action="store_true", help="show full tracebacks")


def sweep_command(args: argparse.Namespace) -> int:
    """Run ``trainwright sweep``; return the exit status."""
    from trainwright.sweeps import run_sweep

    cfg = Config.fromfile(args.config)
    cfg.merge_from_args(args.cfg_options)
    run_sweep(
        cfg,
        params=args.param,
        trials=args.trials,
        metric=args.metric,
        direction=args.direction,
        storage=args.storage,
        study_name=args.study_name,
        pruner=args.pruner,
        work_dir=args.work_dir,
        seed=args.seed,
        startup_trials=args.startup_trials,
    )
    return 0
