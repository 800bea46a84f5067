"""Hyper-parameter sweeps: each Optuna trial trains one Trainer built from the config with the trial's overrides.

:func:`run_sweep` is the Python API that ``trainwright sweep`` calls. Parameters are dotted
config keys with a distribution (:func:`parse_param`: ``loguniform:a:b``, ``uniform:a:b``,
``int:a:b[:log]``, ``choice:x,y,z``); each trial trains in ``<work_dir>/trial_<n>``; a hook
reports the metric after every validation and stops a trial the pruner gives up on; the
study lives in Optuna storage, so the same command continues an interrupted sweep. Needs
the ``trainwright[optuna]`` extra.
"""

from trainwright.logging.metric_key import metric_key
from trainwright.sweeps.params import DISTRIBUTIONS, Param, check_params, parse_param, require_optuna, resolve_direction
from trainwright.sweeps.pruning import SweepPruningHook
from trainwright.sweeps.results import SweepResult, TrialRecord
from trainwright.sweeps.run import run_sweep

__all__ = [
    "DISTRIBUTIONS",
    "Param",
    "SweepPruningHook",
    "SweepResult",
    "TrialRecord",
    "check_params",
    "metric_key",
    "parse_param",
    "require_optuna",
    "resolve_direction",
    "run_sweep",
]
