"""Running a sweep: :func:`run_sweep` opens (or continues) the Optuna study and trains one Trainer per trial.

The study handling lives here too: checking the sweep before anything trains, opening the
study and refusing a resume with other settings, re-queueing trials a killed sweep left
running, and turning each trial's ending (complete, pruned, diverged, failed) into its state.
"""

from __future__ import annotations

import copy
import math
import os
import socket
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainwright.config import Config
from trainwright.registry import ConfigError, did_you_mean
from trainwright.sweeps.params import Param, check_params, parse_param, require_optuna, resolve_direction
from trainwright.sweeps.pruning import SweepPruningHook
from trainwright.sweeps.results import SweepResult, write_best_config, write_results

_PRUNERS = ("median", "none")


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
    base = (
        Config.fromfile(cfg) if isinstance(cfg, (str, Path)) else cfg if isinstance(cfg, Config) else Config(dict(cfg))
    )
    parsed = [p if isinstance(p, Param) else parse_param(p) for p in params]
    if not parsed:
        raise ConfigError(
            "a sweep needs at least one parameter: --param KEY=DIST, e.g. "
            "optim_wrapper.optimizer.lr=loguniform:1e-4:1e-1"
        )
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
    out = (
        Path(work_dir) if work_dir is not None else Path(base.get("work_dir") or f"work_dirs/{name}") / f"sweep_{name}"
    )
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
        trial.set_user_attr("owner", _owner())
        try:
            _run_trial(optuna, study, trial, base, trial_dir, metric, say)
        finally:  # the table is current after every trial, also when one stops the sweep
            write_results(study, result, parsed, TrialState)
    write_results(study, result, parsed, TrialState)
    result.best_config = write_best_config(base, result, out)
    if result.best is not None:
        say(
            f"sweep {name!r}: best trial {result.best.number}: {metric} = {result.best.value:.6g} with "
            f"{result.best.params}; "
            f"results in {result.results_csv}, best config in {result.best_config}"
        )
    else:
        say(f"sweep {name!r}: no trial completed; results in {result.results_csv}")
    return result


def _check_validation(cfg: Mapping[str, Any]) -> None:
    missing = [k for k in ("val_dataloader", "val_evaluator") if cfg.get(k) is None]
    if missing:
        raise ConfigError(
            f"a sweep compares trials by a validation metric, but the config has no {' and no '.join(missing)}: add "
            "val_dataloader=dict(...) "
            "and val_evaluator=dict(type=...) (and train_cfg val_interval) to the config"
        )
    if cfg.get("train_dataloader") is None:
        raise ConfigError("a sweep trains each trial, but the config has no train_dataloader; add one")


def _check_one_process() -> None:
    from trainwright.dist import detect_launcher, launched_world_size

    n = launched_world_size()
    if n > 1:
        raise ConfigError(
            f"trainwright sweep runs its trials one after another in one process, but {detect_launcher()} started {n} "
            "processes; "
            "start it once, without torchrun / srun / mpirun"
        )


def _open_study(
    optuna: Any,
    url: str,
    name: str,
    direction: str,
    metric: str,
    params: Sequence[Param],
    pruner: Any,
    startup: int,
    seed: int | None,
    sampler: Any,
) -> Any:
    if isinstance(pruner, str):
        if pruner not in _PRUNERS:
            raise ConfigError(
                f"--pruner {pruner!r} is not a pruner.{did_you_mean(pruner, list(_PRUNERS))} Use one of "
                f"{list(_PRUNERS)}"
            )
        pruner = (
            optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=0)
            if pruner == "median"
            else optuna.pruners.NopPruner()
        )
    try:
        existing = optuna.study.get_all_study_names(storage=url)
    except Exception as e:
        raise ConfigError(
            f"cannot open the sweep storage {url!r}: {type(e).__name__}: {e}. Give --storage as an Optuna storage URL, "
            "e.g. sqlite:///sweep.db"
        ) from e
    resumed = name in existing
    n_before = 0
    if resumed:
        n_before = len(optuna.load_study(study_name=name, storage=url).trials)
    if sampler is None:
        sampler = optuna.samplers.TPESampler(seed=None if seed is None else seed + n_before)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=getattr(optuna.exceptions, "ExperimentalWarning", Warning))
        study = optuna.create_study(
            storage=url, study_name=name, direction=direction, sampler=sampler, pruner=pruner, load_if_exists=True
        )
    specs = sorted(p.spec() for p in params)
    if resumed:
        old_dir = study.direction.name.lower()
        old_metric, old_specs = study.user_attrs.get("metric"), study.user_attrs.get("params")
        if old_dir != direction:
            raise ConfigError(
                f"study {name!r} in {url} maximises/minimises the other way ({old_dir}); resume it with the same "
                "--direction, or give another --study-name"
            )
        if old_metric is not None and old_metric != metric and not _any_complete(study, optuna.trial.TrialState):
            study.set_user_attr("metric", metric)  # no trial has a value yet (e.g. the first run's --metric was a typo)
        elif old_metric is not None and old_metric != metric:
            raise ConfigError(
                f"study {name!r} in {url} optimises {old_metric!r}, not {metric!r}; resume it with --metric "
                f"{old_metric}, or give another --study-name"
            )
        if old_specs is not None and sorted(old_specs) != specs:
            raise ConfigError(
                f"study {name!r} in {url} sweeps {sorted(old_specs)}, not {specs}; resume it with the same --param "
                "options, or give another --study-name"
            )
    else:
        study.set_user_attr("metric", metric)
        study.set_user_attr("params", specs)
    return study


def _owner() -> str:
    """``host:pid`` of this sweep process, recorded in each trial it runs."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_alive(owner: str) -> str | None:
    """Why the sweep process ``host:pid`` may still run its trial ("still alive", "on another machine": not
    checkable); None: it is gone."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname():
        return "on another machine"
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return None
    except (PermissionError, ValueError):
        pass
    return "still alive"


def _requeue_interrupted(optuna: Any, study: Any, say: Callable[[str], None]) -> None:
    """Mark trials left RUNNING by a sweep process that died as failed; queue their values again (in a new trial).

    A trial another live sweep process runs (several processes may share a study) is left to it.
    """
    TrialState = optuna.trial.TrialState
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("owner")
        alive = _owner_alive(owner) if owner is not None else None
        if alive is not None:
            say(f"sweep: trial {t.number} is running in sweep process {owner} ({alive}): left to it")
            continue
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        if t.params:
            study.enqueue_trial(dict(t.params), user_attrs={"rerun_of": t.number})
        say(
            f"sweep: trial {t.number} was running when the sweep was interrupted: marked failed, its values "
            f"{dict(t.params)} run again in a new trial"
        )


def _any_complete(study: Any, TrialState: Any) -> bool:
    return any(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.get_trials(deepcopy=False))


def _finished(study: Any, TrialState: Any) -> int:
    """Trials that count toward ``trials``: complete, pruned, or failed because the loss diverged."""
    return sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (t.state == TrialState.FAIL and bool(t.user_attrs.get("diverged")))
        for t in study.get_trials(deepcopy=False)
    )


def _run_trial(
    optuna: Any, study: Any, trial: Any, base: Config, trial_dir: Path, metric: str, say: Callable[[str], None]
) -> None:
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
        trial.set_user_attr(
            "error",
            "interrupted" if interrupted else f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
        )
        study.tell(trial, state=TrialState.FAIL)
        if interrupted:
            study.enqueue_trial(dict(trial.params), user_attrs={"rerun_of": trial.number})
            say(
                f"sweep: interrupted during trial {trial.number}: marked failed; run the same command again to "
                "continue (its values run again first)"
            )
        raise
    if hook.missing is not None:
        study.tell(trial, state=TrialState.FAIL)
        raise ConfigError(
            f"--metric {metric!r} is not among the validation metrics "
            f"{hook.missing}.{did_you_mean(metric, hook.missing)} "
            f"Pass one of them as --metric (trial {trial.number} was stopped and marked failed)"
        )
    if hook.pruned:
        study.tell(trial, state=TrialState.PRUNED)
        say(f"sweep: trial {trial.number} pruned at step {hook.last_step} ({metric} = {hook.last_value:.6g})")
        return
    if hook.last_value is None:
        trial.set_user_attr("error", "no validation ran")
        study.tell(trial, state=TrialState.FAIL)
        raise ConfigError(
            f"trial {trial.number} trained without validating, so it has no {metric!r}; check train_cfg val_interval / "
            "val_begin"
        )
    if not math.isfinite(hook.last_value):
        trial.set_user_attr("diverged", True)
        trial.set_user_attr("error", f"{metric} = {hook.last_value}")
        study.tell(trial, state=TrialState.FAIL)
        say(f"sweep: trial {trial.number} ended with {metric} = {hook.last_value}: failed, counted as finished")
        return
    study.tell(trial, hook.last_value)
    say(f"sweep: trial {trial.number} complete: {metric} = {hook.last_value:.6g}")
