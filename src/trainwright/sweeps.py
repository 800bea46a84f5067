"""Hyper-parameter sweeps: each Optuna trial trains one Trainer built from the config with the trial's overrides.

:func:`run_sweep` is the Python API that ``trainwright sweep`` calls. Parameters are dotted
config keys with a distribution (:func:`parse_param`: ``loguniform:a:b``, ``uniform:a:b``,
``int:a:b[:log]``, ``choice:x,y,z``); each trial trains in ``<work_dir>/trial_<n>``; a hook
reports the metric after every validation and stops a trial the pruner gives up on; the
study lives in Optuna storage, so the same command continues an interrupted sweep. Needs
the ``trainwright[optuna]`` extra.
"""

from __future__ import annotations

import copy
import csv
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from trainwright.config import Config
from trainwright.config.overrides import parse_value
from trainwright.hooks.checkpoint import infer_rule
from trainwright.hooks.hook import Hook
from trainwright.registry import ConfigError, did_you_mean

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView

#: The distributions a ``--param`` may name, with the form each takes.
DISTRIBUTIONS: dict[str, str] = {
    "loguniform": "loguniform:LOW:HIGH (floats, 0 < LOW < HIGH, sampled on a log scale)",
    "uniform": "uniform:LOW:HIGH (floats, LOW < HIGH)",
    "int": "int:LOW:HIGH[:log] (integers, LOW < HIGH, both included)",
    "choice": "choice:A,B,C (values: int, float, bool, none or string)",
}
_DIRECTIONS = {"max": "maximize", "maximize": "maximize", "min": "minimize", "minimize": "minimize"}
_PRUNERS = ("median", "none")
_CONFIG_SUFFIXES = (".py", ".yaml", ".yml", ".json")
_INSTALL = "pip install 'trainwright[optuna]'"


@dataclass(frozen=True)
class Param:
    """One swept config key and its distribution (see :data:`DISTRIBUTIONS`).

    Attributes:
        key: Dotted config key (``optim_wrapper.optimizer.lr``), as ``--cfg-options`` takes it.
        kind: ``"loguniform"``, ``"uniform"``, ``"int"`` or ``"choice"``.
        low: Lower bound (ranges).
        high: Upper bound (ranges, included).
        log: Sample on a log scale (``loguniform``; ``int:a:b:log``).
        choices: The values of a ``choice``.
    """

    key: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def distribution(self) -> Any:
        """The Optuna distribution of this parameter."""
        optuna = require_optuna()
        d = optuna.distributions
        if self.kind == "choice":
            return d.CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return d.IntDistribution(int(self.low or 0), int(self.high or 0), log=self.log)
        return d.FloatDistribution(float(self.low or 0.0), float(self.high or 0.0), log=self.log)

    def spec(self) -> str:
        """The ``KEY=DIST:...`` text this parameter is parsed from (normalised)."""
        if self.kind == "choice":
            return f"{self.key}=choice:{','.join(str(c) for c in self.choices)}"
        if self.kind == "int":
            return f"{self.key}=int:{int(self.low or 0)}:{int(self.high or 0)}{':log' if self.log else ''}"
        return f"{self.key}={self.kind}:{self.low!r}:{self.high!r}"


def parse_param(text: str) -> Param:
    """``"optim_wrapper.optimizer.lr=loguniform:1e-4:1e-1"`` -> a :class:`Param`.

    Raises:
        ConfigError: no ``=``, an empty key, an unknown distribution, or a malformed range
            (wrong number of bounds, bounds that are not numbers, low >= high, a log scale
            with a bound <= 0, an empty or repeated choice).
    """
    key, sep, dist = text.partition("=")
    key = key.strip()
    forms = "; ".join(DISTRIBUTIONS.values())
    if not sep or not dist.strip():
        raise ConfigError(f"--param {text!r} needs KEY=DISTRIBUTION, e.g. optim_wrapper.optimizer.lr=loguniform:1e-4:1e-1 (distributions: {forms})")
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--param {text!r}: the key is empty or has an empty part; write a dotted config key such as optim_wrapper.optimizer.lr")
    kind, _, rest = dist.strip().partition(":")
    kind = kind.strip().lower()
    where = f"--param {text!r}"
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"{where}: unknown distribution {kind!r}.{did_you_mean(kind, list(DISTRIBUTIONS))} Use one of: {forms}")
    if kind == "choice":
        return Param(key, kind, choices=_parse_choices(rest, where))
    parts = [p.strip() for p in rest.split(":")] if rest.strip() else []
    log = False
    if kind == "int" and len(parts) == 3:
        if parts[2].lower() != "log":
            raise ConfigError(f"{where}: the third field of int:LOW:HIGH:log may only be 'log', got {parts[2]!r}")
        parts, log = parts[:2], True
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{where}: {kind} needs two bounds, written {DISTRIBUTIONS[kind]}; got {rest!r}")
    low, high = (_number(p, kind, where) for p in parts)
    if not low < high:
        raise ConfigError(f"{where}: the low bound {parts[0]} must be smaller than the high bound {parts[1]}; swap them")
    if kind == "loguniform":
        log = True
    if log and low <= 0:
        raise ConfigError(f"{where}: a log scale needs bounds > 0, got {parts[0]}; use uniform:{parts[0]}:{parts[1]} or a positive low bound")
    return Param(key, kind, low=low, high=high, log=log)


def _number(text: str, kind: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a number; {kind} is written {DISTRIBUTIONS[kind]}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{where}: the bound {text!r} is not finite; give finite numbers")
    if kind == "int":
        if not value.is_integer():
            raise ConfigError(f"{where}: int bounds must be whole numbers, got {text!r}; use uniform:LOW:HIGH for floats")
        return int(value)
    return value


def _parse_choices(rest: str, where: str) -> tuple[Any, ...]:
    if not rest.strip():
        raise ConfigError(f"{where}: choice needs at least one value, written {DISTRIBUTIONS['choice']}")
    values = []
    for item in rest.split(","):
        if not item.strip():
            raise ConfigError(f"{where}: choice has an empty value (two commas in a row, or a trailing comma)")
        try:
            value = parse_value(item)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise ConfigError(f"{where}: choice values must be int, float, bool, none or strings; {item.strip()!r} is a {type(value).__name__}")
        values.append(value)
    seen: list[Any] = []
    for v in values:
        if any(type(v) is type(s) and v == s for s in seen):
            raise ConfigError(f"{where}: choice lists {v!r} twice; give each value once")
        seen.append(v)
    return tuple(values)


def check_params(cfg: Mapping[str, Any], params: Sequence[Param]) -> None:
    """Check that every parameter names a key of ``cfg`` that holds a value (not a dict of keys).

    Raises:
        ConfigError: a key given twice, or one ``cfg`` does not have (the message names the
            closest keys at the level where the path broke off).
    """
    seen: set[str] = set()
    for p in params:
        if p.key in seen:
            raise ConfigError(f"--param {p.key} is given twice; give each key once")
        seen.add(p.key)
        node: Any = cfg
        parts = p.key.split(".")
        for i, part in enumerate(parts):
            here = ".".join(parts[:i]) or "the config"
            if isinstance(node, Mapping):
                if part not in node:
                    keys = [str(k) for k in node if not str(k).startswith("_")]
                    raise ConfigError(
                        f"--param {p.key}: {here} has no key {part!r}.{did_you_mean(part, keys)} Its keys: {sorted(keys)}. "
                        "Sweep keys the config sets (add the key to the config, e.g. with its default value, to sweep it)"
                    )
                node = node[part]
            elif isinstance(node, (list, tuple)):
                if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
                    raise ConfigError(f"--param {p.key}: {here} is a list of {len(node)} items; {part!r} is not an index of it")
                node = node[int(part)]
            else:
                raise ConfigError(f"--param {p.key}: {here} is a {type(node).__name__} ({node!r}), not a dict; sweep {here} itself")
        if isinstance(node, Mapping):
            raise ConfigError(f"--param {p.key}: {p.key} is a dict; sweep one of its keys, e.g. {', '.join(f'{p.key}.{k}' for k in list(node)[:3])}")


def require_optuna() -> Any:
    """The ``optuna`` module, or a ConfigError naming the extra that installs it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError(f"trainwright sweep needs Optuna, which is not installed: {_INSTALL} (or pip install optuna)") from None
    return optuna


def resolve_direction(direction: str | None, metric: str) -> str:
    """``"maximize"`` or ``"minimize"`` from ``max`` / ``min`` (or the long names); None: inferred from the metric's name."""
    if direction is None:
        try:
            return "maximize" if infer_rule(metric) == "greater" else "minimize"
        except ValueError:
            raise ConfigError(f"cannot tell whether a higher or a lower {metric!r} is better; pass --direction max or --direction min") from None
    d = _DIRECTIONS.get(str(direction).lower())
    if d is None:
        raise ConfigError(f"--direction {direction!r} is not a direction; use max or min")
    return d


class SweepPruningHook(Hook):
    """Reports the swept metric to the Optuna trial after each validation; stops the trial when the pruner gives up on it.

    The step is the epoch (epoch-based loops) or the iteration. The decision is taken on rank
    0 and broadcast, so every process stops at the same point; the stop is
    ``trainer.should_stop`` (training ends after the current validation, cleanly). A metric
    the validation does not produce stops the trial too (:attr:`missing` then holds the
    metrics it did produce).
    """

    priority = "LOW"  # after the logger (and EMA's val/raw keys), as EarlyStoppingHook

    def __init__(self, trial: Any, metric: str) -> None:
        self.trial = trial
        self.metric = metric
        self.last_value: float | None = None
        self.last_step: int | None = None
        self.pruned = False
        self.missing: list[str] | None = None

    @override
    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:
        """Report the metric and ask the pruner (None: a stop request cut the pass; nothing to report)."""
        loop = trainer.train_loop
        if metrics is None or loop is None:
            return
        key = metric_key(self.metric, metrics)
        if key is None:
            self.missing = sorted(metrics)
            trainer.logger.error(f"Sweep: the validation metrics {self.missing} do not include {self.metric!r}; stopping the sweep")
            trainer.should_stop = True
            return
        value = float(metrics[key])
        step = trainer.progress.epoch if loop.by_epoch else trainer.progress.iteration
        self.last_value, self.last_step = value, step
        prune = None
        if trainer.strategy.is_main_process:
            self.trial.report(value, step)
            prune = bool(self.trial.should_prune())
        if trainer.strategy.broadcast_object(prune):
            self.pruned = True
            trainer.should_stop = True
            trainer.logger.info(f"Sweep: trial {self.trial.number} pruned at {'epoch' if loop.by_epoch else 'iteration'} {step} ({self.metric} = {value:.6g})")


def metric_key(metric: str, metrics: Mapping[str, Any]) -> str | None:
    """The key of ``metric`` in ``metrics``: itself, or ``val/<metric>``; None if absent."""
    return next((k for k in (metric, f"val/{metric}") if k in metrics), None)


@dataclass
class TrialRecord:
    """One row of the results table.

    Attributes:
        number: Optuna's trial number (the work dir is ``trial_<number>``).
        state: ``COMPLETE``, ``PRUNED``, ``FAIL``, ``RUNNING`` or ``WAITING``.
        value: The metric at the trial's last validation (pruned: where it was stopped); None without one.
        params: The swept keys and the values this trial used.
        work_dir: The trial's work dir.
        note: Why it failed, where it was pruned, or which interrupted trial it re-runs.
    """

    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    work_dir: str
    note: str = ""


@dataclass
class SweepResult:
    """What :func:`run_sweep` returns.

    Attributes:
        study_name: The Optuna study (continue it with the same storage and name).
        storage: The storage URL.
        metric: The optimised metric key.
        direction: ``"maximize"`` or ``"minimize"``.
        work_dir: Where the trials' work dirs, the results table and the best config are.
        trials: Every trial of the study, as the table lists them.
        best: The best complete trial (None if none completed).
        results_csv: The results table.
        best_config: The config with the best trial's values (None if none completed).
    """

    study_name: str
    storage: str
    metric: str
    direction: str
    work_dir: Path
    trials: list[TrialRecord] = field(default_factory=list)
    best: TrialRecord | None = None
    results_csv: Path | None = None
    best_config: Path | None = None

    def count(self, state: str) -> int:
        """How many trials are in ``state`` (``"COMPLETE"``, ``"PRUNED"``, ...)."""
        return sum(t.state == state for t in self.trials)


def run_sweep(
    cfg: Mapping[str, Any] | str | Path,
    params: Sequence[str | Param],
    trials: int,
    metric: str,
    direction: str | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    pruner: str | Any = "median",
    work_dir: str | Path | None = None,
    seed: int | None = None,
    startup_trials: int = 5,
    sampler: Any = None,
    log: Callable[[str], None] | None = print,
) -> SweepResult:
    """Run (or continue) a sweep of ``trials`` trials; each trains ``Trainer.from_config(cfg + the trial's values)``.

    Everything is checked before anything trains: the parameters (:func:`parse_param`, their
    keys against ``cfg``), that the config validates, the direction, Optuna's presence.
    Whether validation produces ``metric`` is known at the first trial's first validation:
    a metric it does not produce stops the sweep with an error naming the ones it does.

    The study is created in ``storage`` or, when it exists there under ``study_name``,
    continued: complete, pruned and diverged (NaN loss) trials count toward ``trials``; a
    trial left running by an interrupted sweep (killed, preempted) is marked failed and
    re-run first with the same values, in a new trial. One sweep process per study.

    Args:
        cfg: A :class:`Config`, a dict, or a config file's path.
        params: ``"KEY=DIST:..."`` strings or :class:`Param` (see :data:`DISTRIBUTIONS`).
        trials: How many trials should have finished (complete, pruned or diverged) in the end.
        metric: The validation metric to optimise (``"val/acc"``; ``"acc"`` finds ``val/acc``).
        direction: ``"max"`` or ``"min"``; None infers it from the metric's name (``acc`` -> max, ``loss`` -> min).
        storage: Optuna storage URL; default ``sqlite:///<work_dir>/sweep.db``.
        study_name: Default: the config file's name (``"sweep"`` for a dict).
        pruner: ``"median"`` (Optuna's MedianPruner: after ``startup_trials`` finished trials, stop
            a trial whose value is worse than the median of the earlier trials at the same step),
            ``"none"``, or an Optuna pruner.
        work_dir: Default: ``<cfg work_dir or work_dirs/<config name>>/sweep_<study_name>``.
        seed: Seeds the sampler (a continued sweep offsets it by the number of trials so far),
            so a sweep's choices repeat. Each trial's training is seeded by the config's ``randomness``.
        startup_trials: Trials that run to the end before the median pruner prunes any.
        sampler: An Optuna sampler; default TPE (``seed``).
        log: Where the one-line summary of each trial goes (None: nowhere).

    Raises:
        ConfigError: bad input (see above), a trial whose config does not build, or a ``metric``
            the validation does not produce.
    """
    base = Config.fromfile(cfg) if isinstance(cfg, (str, Path)) else cfg if isinstance(cfg, Config) else Config(dict(cfg))
    parsed = [p if isinstance(p, Param) else parse_param(p) for p in params]
    if not parsed:
        raise ConfigError("a sweep needs at least one parameter: --param KEY=DIST, e.g. optim_wrapper.optimizer.lr=loguniform:1e-4:1e-1")
    check_params(base, parsed)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ConfigError(f"--trials must be an int >= 1, got {trials!r}")
    if not isinstance(startup_trials, int) or startup_trials < 0:
        raise ConfigError(f"--startup-trials must be an int >= 0, got {startup_trials!r}")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"--metric must name a validation metric such as val/acc, got {metric!r}")
    _check_validation(base)
    direction = resolve_direction(direction, metric)
    _check_one_process()
    optuna = require_optuna()
    name = study_name or (Path(base.filename).stem if base.filename else "sweep")
    out = Path(work_dir) if work_dir is not None else Path(base.get("work_dir") or f"work_dirs/{name}") / f"sweep_{name}"
    out.mkdir(parents=True, exist_ok=True)
    url = storage or f"sqlite:///{(out / 'sweep.db').as_posix()}"
    say = log or (lambda _msg: None)

    study = _open_study(optuna, url, name, direction, metric, parsed, pruner, startup_trials, seed, sampler)
    _requeue_interrupted(optuna, study, say)
    TrialState = optuna.trial.TrialState
    distributions = {p.key: p.distribution() for p in parsed}
    result = SweepResult(study_name=name, storage=url, metric=metric, direction=direction, work_dir=out)
    done = _finished(study, TrialState)
    if done:
        say(f"sweep {name!r}: continuing; {done} of {trials} trials finished already ({url})")
    while _finished(study, TrialState) < trials:
        trial = study.ask(distributions)
        trial_dir = out / f"trial_{trial.number}"
        trial.set_user_attr("work_dir", str(trial_dir))
        try:
            _run_trial(optuna, study, trial, base, trial_dir, metric, say)
        finally:  # the table is current after every trial, also when one stops the sweep
            _write_results(study, result, parsed, TrialState)
    _write_results(study, result, parsed, TrialState)
    result.best_config = _write_best_config(base, result, out)
    if result.best is not None:
        say(f"sweep {name!r}: best trial {result.best.number}: {metric} = {result.best.value:.6g} with {result.best.params}; "
            f"results in {result.results_csv}, best config in {result.best_config}")
    else:
        say(f"sweep {name!r}: no trial completed; results in {result.results_csv}")
    return result


def _check_validation(cfg: Mapping[str, Any]) -> None:
    missing = [k for k in ("val_dataloader", "val_evaluator") if cfg.get(k) is None]
    if missing:
        raise ConfigError(
            f"a sweep compares trials by a validation metric, but the config has no {' and no '.join(missing)}: add val_dataloader=dict(...) "
            "and val_evaluator=dict(type=...) (and train_cfg val_interval) to the config"
        )
    if cfg.get("train_dataloader") is None:
        raise ConfigError("a sweep trains each trial, but the config has no train_dataloader; add one")


def _check_one_process() -> None:
    from trainwright.dist import detect_launcher, launched_world_size

    n = launched_world_size()
    if n > 1:
        raise ConfigError(
            f"trainwright sweep runs its trials one after another in one process, but {detect_launcher()} started {n} processes; "
            "start it once, without torchrun / srun / mpirun"
        )


def _open_study(optuna: Any, url: str, name: str, direction: str, metric: str, params: Sequence[Param], pruner: Any, startup: int, seed: int | None, sampler: Any) -> Any:
    if isinstance(pruner, str):
        if pruner not in _PRUNERS:
            raise ConfigError(f"--pruner {pruner!r} is not a pruner.{did_you_mean(pruner, list(_PRUNERS))} Use one of {list(_PRUNERS)}")
        pruner = optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=0) if pruner == "median" else optuna.pruners.NopPruner()
    try:
        existing = optuna.study.get_all_study_names(storage=url)
    except Exception as e:
        raise ConfigError(f"cannot open the sweep storage {url!r}: {type(e).__name__}: {e}. Give --storage as an Optuna storage URL, e.g. sqlite:///sweep.db") from e
    resumed = name in existing
    n_before = 0
    if resumed:
        n_before = len(optuna.load_study(study_name=name, storage=url).trials)
    if sampler is None:
        sampler = optuna.samplers.TPESampler(seed=None if seed is None else seed + n_before)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=getattr(optuna.exceptions, "ExperimentalWarning", Warning))
        study = optuna.create_study(storage=url, study_name=name, direction=direction, sampler=sampler, pruner=pruner, load_if_exists=True)
    specs = sorted(p.spec() for p in params)
    if resumed:
        old_dir = study.direction.name.lower()
        old_metric, old_specs = study.user_attrs.get("metric"), study.user_attrs.get("params")
        if old_dir != direction:
            raise ConfigError(f"study {name!r} in {url} maximises/minimises the other way ({old_dir}); resume it with the same --direction, or give another --study-name")
        if old_metric is not None and old_metric != metric:
            raise ConfigError(f"study {name!r} in {url} optimises {old_metric!r}, not {metric!r}; resume it with --metric {old_metric}, or give another --study-name")
        if old_specs is not None and sorted(old_specs) != specs:
            raise ConfigError(f"study {name!r} in {url} sweeps {sorted(old_specs)}, not {specs}; resume it with the same --param options, or give another --study-name")
    else:
        study.set_user_attr("metric", metric)
        study.set_user_attr("params", specs)
    return study


def _requeue_interrupted(optuna: Any, study: Any, say: Callable[[str], None]) -> None:
    """Mark trials left RUNNING by a sweep that died as failed; queue their values again (in a new trial)."""
    TrialState = optuna.trial.TrialState
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        if t.params:
            study.enqueue_trial(dict(t.params), user_attrs={"rerun_of": t.number})
        say(f"sweep: trial {t.number} was running when the sweep was interrupted: marked failed, its values {dict(t.params)} run again in a new trial")


def _finished(study: Any, TrialState: Any) -> int:
    """Trials that count toward ``trials``: complete, pruned, or failed because the loss diverged."""
    return sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (t.state == TrialState.FAIL and bool(t.user_attrs.get("diverged")))
        for t in study.get_trials(deepcopy=False)
    )


def _run_trial(optuna: Any, study: Any, trial: Any, base: Config, trial_dir: Path, metric: str, say: Callable[[str], None]) -> None:
    from trainwright.trainer import Trainer

    TrialState = optuna.trial.TrialState
    trial_cfg = copy.deepcopy(base)
    trial_cfg.merge_from_dict(dict(trial.params))
    trial_cfg.work_dir = str(trial_dir)
    hook = SweepPruningHook(trial, metric)
    say(f"sweep: trial {trial.number} starts with {dict(trial.params)} in {trial_dir}")
    try:
        trainer = Trainer.from_config(trial_cfg)
        try:
            trainer.register_hook(hook)
            trainer.train()
        finally:
            trainer.close()
    except FloatingPointError as e:  # the loss diverged: a hopeless trial, not a broken sweep
        trial.set_user_attr("diverged", True)
        trial.set_user_attr("error", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        study.tell(trial, state=TrialState.FAIL)
        say(f"sweep: trial {trial.number} diverged (loss NaN/Inf): failed, counted as finished")
        return
    except BaseException as e:
        interrupted = isinstance(e, (KeyboardInterrupt, SystemExit))
        if isinstance(e, ConfigError):  # the config does not build (or train) with these values: say which
            trial.set_user_attr("error", f"ConfigError: {str(e).splitlines()[0][:200]}")
            study.tell(trial, state=TrialState.FAIL)
            raise ConfigError(f"trial {trial.number} with {dict(trial.params)}: {e}") from e
        trial.set_user_attr("error", "interrupted" if interrupted else f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        study.tell(trial, state=TrialState.FAIL)
        if interrupted:
            study.enqueue_trial(dict(trial.params), user_attrs={"rerun_of": trial.number})
            say(f"sweep: interrupted during trial {trial.number}: marked failed; run the same command again to continue (its values run again first)")
        raise
    if hook.missing is not None:
        study.tell(trial, state=TrialState.FAIL)
        raise ConfigError(
            f"--metric {metric!r} is not among the validation metrics {hook.missing}.{did_you_mean(metric, hook.missing)} "
            f"Pass one of them as --metric (trial {trial.number} was stopped and marked failed)"
        )
    if hook.pruned:
        study.tell(trial, state=TrialState.PRUNED)
        say(f"sweep: trial {trial.number} pruned at step {hook.last_step} ({metric} = {hook.last_value:.6g})")
        return
    if hook.last_value is None:
        trial.set_user_attr("error", "no validation ran")
        study.tell(trial, state=TrialState.FAIL)
        raise ConfigError(f"trial {trial.number} trained without validating, so it has no {metric!r}; check train_cfg val_interval / val_begin")
    if not math.isfinite(hook.last_value):
        trial.set_user_attr("diverged", True)
        trial.set_user_attr("error", f"{metric} = {hook.last_value}")
        study.tell(trial, state=TrialState.FAIL)
        say(f"sweep: trial {trial.number} ended with {metric} = {hook.last_value}: failed, counted as finished")
        return
    study.tell(trial, hook.last_value)
    say(f"sweep: trial {trial.number} complete: {metric} = {hook.last_value:.6g}")


def _note(t: Any, TrialState: Any) -> str:
    notes = []
    if "rerun_of" in t.user_attrs:
        notes.append(f"re-runs interrupted trial {t.user_attrs['rerun_of']}")
    if t.state == TrialState.PRUNED and t.last_step is not None:
        notes.append(f"pruned at step {t.last_step}")
    if t.state == TrialState.FAIL:
        notes.append(str(t.user_attrs.get("error", "interrupted (the sweep was killed while it ran)")))
    return "; ".join(notes)


def _write_results(study: Any, result: SweepResult, params: Sequence[Param], TrialState: Any) -> None:
    """The results table ``results.csv``: one row per trial (number, state, value, the swept keys, work dir, note)."""
    records = []
    for t in study.get_trials(deepcopy=False):
        value = t.value if t.state in (TrialState.COMPLETE, TrialState.PRUNED) else None
        records.append(TrialRecord(
            number=t.number, state=t.state.name, value=value, params=dict(t.params),
            work_dir=str(t.user_attrs.get("work_dir", result.work_dir / f"trial_{t.number}")), note=_note(t, TrialState),
        ))
    result.trials = records
    complete = [r for r in records if r.state == "COMPLETE" and r.value is not None]
    if complete:
        pick = max if result.direction == "maximize" else min
        result.best = pick(complete, key=lambda r: float(r.value))  # type: ignore[arg-type]
    path = result.work_dir / "results.csv"
    tmp = path.with_suffix(".csv.tmp")
    keys = [p.key for p in params]
    with tmp.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["number", "state", result.metric, *keys, "work_dir", "note"])
        for r in records:
            w.writerow([r.number, r.state, "" if r.value is None else repr(r.value), *(r.params.get(k, "") for k in keys), r.work_dir, r.note])
    tmp.replace(path)
    result.results_csv = path


def _write_best_config(base: Config, result: SweepResult, out: Path) -> Path | None:
    """The config with the best trial's values (``best_config<suffix of the config file>``), written with :meth:`Config.dump`."""
    if result.best is None:
        return None
    best = copy.deepcopy(base)
    best.merge_from_dict(result.best.params)
    suffix = Path(base.filename).suffix if base.filename else ".py"
    return best.dump(out / f"best_config{suffix if suffix in _CONFIG_SUFFIXES else '.py'}")
