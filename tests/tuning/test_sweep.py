"""``trainwright sweep`` / ``run_sweep``: a real Optuna study (sqlite file) over the digits example.

It finds a good config, prunes hopeless trials, continues after being killed without re-running
finished trials, writes the results table and a best config that trains; bad input is refused
before anything trains, with a message that names the fix.
"""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from launch import gloo_env

import trainwright as tw
from trainwright.cli import main
from trainwright.config import Config
from trainwright.registry import ConfigError
from trainwright.sweeps import parse_param, run_sweep

optuna = pytest.importorskip("optuna")

ROOT = Path(__file__).resolve().parents[2]
DIGITS = str(ROOT / "examples" / "digits.py")
#: Short trials: 3 epochs of 23 batches, constant lr (the example's warm-up is 50 iterations), no checkpoints.
FAST = {
    "train_cfg.max_epochs": 3,
    "train_dataloader.batch_size": 64,
    "param_scheduler": [],
    "default_hooks.checkpoint": None,
    "log_level": "WARNING",
}
#: lr 1e-6 is hopeless (about chance after 3 epochs): the median pruner stops it at its first validation.
PARAMS = ["optim_wrapper.optimizer.lr=choice:0.1,0.05,1e-6", "model.hidden=choice:32,64"]


@pytest.fixture
def one_thread():
    """Tiny models train several times faster on one thread on a shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _digits(**extra) -> Config:
    cfg = Config.fromfile(DIGITS)
    cfg.merge_from_dict({**FAST, **extra})
    return cfg


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _val_records(trial_dir: Path) -> int:
    (run,) = [p for p in trial_dir.iterdir() if p.is_dir() and (p / "metrics.jsonl").exists()]
    return sum('"mode": "val"' in line for line in (run / "metrics.jsonl").read_text().splitlines())


@pytest.mark.slow
def test_sweep_finds_good_config_prunes_and_best_config_trains(tmp_path, one_thread):
    out = tmp_path / "sweep"
    result = run_sweep(
        _digits(),
        PARAMS,
        trials=8,
        metric="val/acc",
        direction="max",
        storage=f"sqlite:///{tmp_path / 'sweep.db'}",
        seed=1,
        startup_trials=2,
        work_dir=out,
        log=None,
    )

    study = optuna.load_study(study_name="digits", storage=f"sqlite:///{tmp_path / 'sweep.db'}")
    states = [t.state.name for t in study.trials]
    assert len(states) == 8 and set(states) <= {"COMPLETE", "PRUNED"}
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert pruned, states
    for (
        t
    ) in pruned:  # stopped at the first validation of 3: one val record in its work dir, the value it was pruned with
        assert t.last_step == 1 and _val_records(out / f"trial_{t.number}") == 1
    assert any(t.params["optim_wrapper.optimizer.lr"] == 1e-6 for t in pruned)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    for t in complete:
        assert _val_records(out / f"trial_{t.number}") == 3
    assert result.best is not None and result.best.value == max(t.value for t in complete) >= 0.9
    assert result.best.params == study.best_trial.params

    # the results table: one row per trial, as the study has it
    rows = _rows(out / "results.csv")
    assert [int(r["number"]) for r in rows] == list(range(8))
    for r, t in zip(rows, study.trials):
        assert r["state"] == t.state.name and float(r["val/acc"]) == pytest.approx(t.value)
        assert (
            float(r["optim_wrapper.optimizer.lr"]) == t.params["optim_wrapper.optimizer.lr"]
            and int(r["model.hidden"]) == t.params["model.hidden"]
        )
        assert r["work_dir"] == str(out / f"trial_{t.number}")
    assert all("pruned at step 1" in r["note"] for r in rows if r["state"] == "PRUNED")

    # the best config: the example with the best trial's values; it trains to the same accuracy
    assert result.best_config == out / "best_config.py"
    best = Config.fromfile(result.best_config)
    assert best.optim_wrapper.optimizer.lr == result.best.params["optim_wrapper.optimizer.lr"]
    assert best.model.hidden == result.best.params["model.hidden"]
    assert best.train_cfg.max_epochs == 3
    trainer = tw.Trainer.from_config(best, work_dir=str(tmp_path / "best"))
    try:
        trainer.train()
        assert trainer.val()["val/acc"] == pytest.approx(result.best.value)
    finally:
        trainer.close()


def _sweep_cmd(tmp_path: Path) -> list[str]:
    opts = [f"{k}={v}" for k, v in FAST.items()]
    return [
        sys.executable,
        "-m",
        "trainwright",
        "sweep",
        DIGITS,
        "--trials",
        "8",
        *(a for p in PARAMS for a in ("--param", p)),
        "--metric",
        "val/acc",
        "--direction",
        "max",
        "--storage",
        f"sqlite:///{tmp_path / 'sweep.db'}",
        "--study-name",
        "digits",
        "--seed",
        "1",
        "--startup-trials",
        "2",
        "--work-dir",
        str(tmp_path / "sweep"),
        "--cfg-options",
        *opts,
    ]


def _run_until(tmp_path: Path, cmd: list[str], started: Path | None, sig: int | None, name: str) -> tuple[int, str]:
    """Run the sweep; with ``started``, send ``sig`` once that trial's folder exists (it is training then)."""
    log = tmp_path / f"{name}.log"
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=gloo_env(tmp_path), stdout=f, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 150
            while started is not None and not started.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if started is not None and proc.poll() is None and sig is not None:
                # at once: the trial is RUNNING in the study (ask() comes before its folder), and a pause would let a
                # short trial finish first (then the kill lands between two trials and no trial was interrupted)
                proc.send_signal(sig)
            proc.wait(timeout=150)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode, log.read_text()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sweep_command_resumes_after_being_killed(tmp_path):
    cmd = _sweep_cmd(tmp_path)
    out = tmp_path / "sweep"
    storage = f"sqlite:///{tmp_path / 'sweep.db'}"

    rc, text = _run_until(
        tmp_path, cmd, out / "trial_3", signal.SIGKILL, "run1"
    )  # killed outright once trial 3 starts (on a fast machine, a later one)
    assert rc == -signal.SIGKILL, text[-3000:]
    first = optuna.load_study(study_name="digits", storage=storage).trials
    k = len(first) - 1  # the trial that was training when the sweep was killed
    assert k >= 3 and first[k].state.name == "RUNNING", [
        (t.number, t.state.name) for t in first
    ]  # nobody could mark it
    finished_1 = {t.number: t.value for t in first if t.state.name in ("COMPLETE", "PRUNED")}
    assert set(finished_1) == set(range(k)), [(t.number, t.state.name) for t in first]
    mtimes = {n: sorted((p.name, p.stat().st_mtime_ns) for p in (out / f"trial_{n}").rglob("*")) for n in finished_1}

    rc, text = _run_until(tmp_path, cmd, None, None, "run2")
    assert rc == 0, text[-3000:]
    assert (
        f"trial {k} was running when the sweep was interrupted" in text
        and f"continuing; {k} of 8 trials finished already" in text
    )

    trials = optuna.load_study(study_name="digits", storage=storage).trials
    states = [t.state.name for t in trials]
    assert sum(s in ("COMPLETE", "PRUNED") for s in states) == 8
    assert len(trials) == 9 and states[k] == "FAIL"  # the killed trial; nothing else ran twice
    (again,) = [
        u for u in trials if u.user_attrs.get("rerun_of") == k
    ]  # it ran again with its values, as the next trial
    assert again.number == k + 1 and again.params == trials[k].params and again.state.name in ("COMPLETE", "PRUNED")
    # the trials finished before the kill were not run again: same values, their folders untouched
    for n, value in finished_1.items():
        assert trials[n].value == value
        assert sorted((p.name, p.stat().st_mtime_ns) for p in (out / f"trial_{n}").rglob("*")) == mtimes[n]

    rows = _rows(out / "results.csv")
    assert [r["state"] for r in rows] == states
    assert "killed while it ran" in rows[k]["note"] and f"re-runs interrupted trial {k}" in rows[k + 1]["note"]
    best = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert best.value >= 0.9
    cfg = Config.fromfile(out / "best_config.py")
    assert (
        cfg.optim_wrapper.optimizer.lr == best.params["optim_wrapper.optimizer.lr"]
        and cfg.model.hidden == best.params["model.hidden"]
    )


class _PreemptTrial(tw.Hook):
    """Sends this process SIGTERM (a cluster's preemption notice) at the 5th iteration of trial 1."""

    fired = False

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        if not _PreemptTrial.fired and trainer.run_dir.parent.name == "trial_1" and trainer.progress.iteration == 5:
            _PreemptTrial.fired = True
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_preempted_sweep_exits_and_runs_the_trial_again(tmp_path, one_thread):
    storage = f"sqlite:///{tmp_path / 'sweep.db'}"
    cfg = _digits(**{"train_cfg.max_epochs": 1, "custom_hooks": [_PreemptTrial()]})
    args = dict(
        trials=3, metric="val/acc", storage=storage, study_name="s", seed=0, work_dir=tmp_path / "out", log=None
    )
    with pytest.raises(SystemExit) as e:  # the trainer's PreemptionHook: finish the step, save, exit 128 + SIGTERM
        run_sweep(cfg, PARAMS, **args)
    assert e.value.code == 128 + signal.SIGTERM
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "WAITING"]
    assert trials[1].user_attrs["error"] == "interrupted" and trials[2].user_attrs["rerun_of"] == 1
    assert (tmp_path / "out" / "trial_1" / "checkpoints" / "iter_5.pth").exists()

    result = run_sweep(cfg, PARAMS, **args)  # the same call again continues the study
    assert [(t.number, t.state) for t in result.trials][:2] == [(0, "COMPLETE"), (1, "FAIL")]
    assert result.trials[2].params == trials[1].params and result.trials[2].state in ("COMPLETE", "PRUNED")
    assert len(result.trials) == 4 and result.count("COMPLETE") + result.count("PRUNED") == 3


# -- bad input: refused before anything trains ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("optim_wrapper.optimizer.lr=logunif:1e-4:1e-1", "unknown distribution 'logunif'. Did you mean 'loguniform'?"),
        ("optim_wrapper.optimizer.lr=normal:0:1", "unknown distribution 'normal'"),
        ("optim_wrapper.optimizer.lr", "needs KEY=DISTRIBUTION"),
        ("=uniform:0:1", "the key is empty"),
        ("optim_wrapper.optimizer.lr=loguniform:1e-4", "loguniform needs two bounds"),
        ("optim_wrapper.optimizer.lr=uniform:0:1:2", "uniform needs two bounds"),
        ("optim_wrapper.optimizer.lr=uniform:0.5:0.1", "must be smaller than the high bound"),
        ("optim_wrapper.optimizer.lr=uniform:a:1", "'a' is not a number"),
        ("optim_wrapper.optimizer.lr=loguniform:0:0.1", "a log scale needs bounds > 0"),
        ("model.hidden=int:16.5:64", "int bounds must be whole numbers"),
        ("model.hidden=int:16:64:lin", "may only be 'log'"),
        ("model.hidden=int:0:64:log", "a log scale needs bounds > 0"),
        ("model.hidden=choice:", "choice needs at least one value"),
        ("model.hidden=choice:32,,64", "empty value"),
        ("model.hidden=choice:32,32", "lists 32 twice"),
        ("model.hidden=choice:{},3", "choice values must be int, float, bool, none or strings; '{}' is a dict"),
        ("model.hidden=choice:[1,3", "unbalanced brackets"),
    ],
)
def test_malformed_param_is_refused(spec, message):
    with pytest.raises(ConfigError, match="--param") as e:
        parse_param(spec)
    assert message in str(e.value)


def test_params_parse_to_optuna_distributions():
    d = optuna.distributions
    assert parse_param("a.b=loguniform:1e-4:1e-1").distribution() == d.FloatDistribution(1e-4, 1e-1, log=True)
    assert parse_param("a.b=uniform:0:1").distribution() == d.FloatDistribution(0.0, 1.0)
    assert parse_param("a=int:2:8").distribution() == d.IntDistribution(2, 8)
    assert parse_param("a=int:2:64:log").distribution() == d.IntDistribution(2, 64, log=True)
    assert parse_param("a=choice:64,0.5,true,adam,none").choices == (64, 0.5, True, "adam", None)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "optim_wrapper.optimizer.lrr=uniform:0.01:0.1",
            "optim_wrapper.optimizer has no key 'lrr'. Did you mean 'lr'?",
        ),
        (
            "optim_wraper.optimizer.lr=uniform:0.01:0.1",
            "the config has no key 'optim_wraper'. Did you mean 'optim_wrapper'?",
        ),
        ("model.hiden=choice:32,64", "model has no key 'hiden'. Did you mean 'hidden'?"),
        ("model=choice:32,64", "model is a dict; sweep one of its keys"),
        ("param_scheduler.5.end=int:1:9", "param_scheduler is a list of 2 items; '5' is not an index of it"),
        ("model.hidden.width=int:1:9", "model.hidden is a int (128), not a dict"),
    ],
)
def test_unknown_param_key_is_refused_before_training(tmp_path, spec, message):
    with pytest.raises(ConfigError) as e:
        run_sweep(Config.fromfile(DIGITS), [spec], trials=2, metric="val/acc", work_dir=tmp_path / "out", log=None)
    assert message in str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(trials=0), "--trials must be an int >= 1"),
        (dict(direction="up"), "--direction 'up' is not a direction; use max or min"),
        (dict(metric="val/recall"), "cannot tell whether a higher or a lower 'val/recall' is better; pass --direction"),
        (dict(pruner="hyperband"), "--pruner 'hyperband' is not a pruner"),
        (dict(params=[]), "needs at least one parameter"),
        (dict(params=["model.hidden=choice:32,64", "model.hidden=int:8:16"]), "--param model.hidden is given twice"),
    ],
)
def test_bad_sweep_arguments_are_refused(tmp_path, kwargs, message):
    args = {
        **dict(params=["model.hidden=choice:32,64"], trials=2, metric="val/acc", work_dir=tmp_path / "out", log=None),
        **kwargs,
    }
    with pytest.raises(ConfigError) as e:
        run_sweep(Config.fromfile(DIGITS), **args)
    assert message in str(e.value)
    assert not any((tmp_path / "out").glob("trial_*"))


@pytest.mark.parametrize("key", ["val_dataloader", "val_evaluator"])
def test_sweep_without_validation_is_refused(tmp_path, key):
    cfg = Config.fromfile(DIGITS)
    cfg[key] = None
    with pytest.raises(ConfigError, match=f"compares trials by a validation metric, but the config has no {key}"):
        run_sweep(cfg, ["model.hidden=choice:32,64"], trials=2, metric="val/acc", work_dir=tmp_path / "out", log=None)
    assert not (tmp_path / "out").exists()


def test_sweep_without_optuna_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError, as when it is not installed
    with pytest.raises(ConfigError, match=r"needs Optuna, which is not installed: pip install 'trainwright\[optuna\]'"):
        run_sweep(
            Config.fromfile(DIGITS),
            ["model.hidden=choice:32,64"],
            trials=2,
            metric="val/acc",
            work_dir=tmp_path / "out",
            log=None,
        )


def test_metric_validation_does_not_produce_stops_at_first_validation(tmp_path, one_thread):
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as e:
        run_sweep(
            _digits(),
            ["model.hidden=choice:32,64"],
            trials=4,
            metric="val/accuracy",
            direction="max",
            work_dir=out,
            log=None,
        )
    msg = str(e.value)
    assert "--metric 'val/accuracy' is not among the validation metrics ['val/acc']. Did you mean 'val/acc'?" in msg
    assert [p.name for p in out.glob("trial_*")] == ["trial_0"] and _val_records(
        out / "trial_0"
    ) == 1  # stopped at its first validation
    assert [(r["number"], r["state"]) for r in _rows(out / "results.csv")] == [("0", "FAIL")]
    # no trial has a value yet, so the same study continues with the corrected metric
    result = run_sweep(
        _digits(), ["model.hidden=choice:32,64"], trials=1, metric="val/acc", direction="max", work_dir=out, log=None
    )
    assert result.best is not None and result.best.value > 0.5


def test_resuming_with_other_settings_is_refused(tmp_path, one_thread):
    storage = f"sqlite:///{tmp_path / 'sweep.db'}"
    base = dict(trials=1, metric="val/acc", storage=storage, work_dir=tmp_path / "out", log=None)
    run_sweep(_digits(**{"train_cfg.max_epochs": 1}), ["model.hidden=choice:32,64"], **base)
    with pytest.raises(
        ConfigError,
        match=r"sweeps \['model.hidden=choice:32,64'\], not \['model.hidden=choice:16,64'\]; resume it with the same "
        r"--param",
    ):
        run_sweep(_digits(), ["model.hidden=choice:16,64"], **base)
    with pytest.raises(ConfigError, match="resume it with the same --direction"):
        run_sweep(_digits(), ["model.hidden=choice:32,64"], **{**base, "direction": "min"})


def test_command_line_errors_exit_2_before_training(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "sweep",
        DIGITS,
        "--trials",
        "2",
        "--param",
        "optim_wrapper.optimizer.lrr=loguniform:1e-4:1e-1",
        "--metric",
        "val/acc",
        "--work-dir",
        str(out),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        "trainwright sweep: error: --param optim_wrapper.optimizer.lrr: optim_wrapper.optimizer has no key 'lrr'. Did "
        "you mean 'lr'?" in err
    )
    assert not out.exists()
    with pytest.raises(SystemExit):  # argparse: --trials is required
        main(["sweep", DIGITS, "--param", "model.hidden=choice:32,64", "--metric", "val/acc"])
    assert "the following arguments are required: --trials" in capsys.readouterr().err


def test_trial_whose_config_does_not_build_names_the_trial(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as e:
        run_sweep(_digits(), ["model.hidden=choice:-5"], trials=2, metric="val/acc", work_dir=out, log=None)
    assert str(e.value).startswith("trial 0 with {'model.hidden': -5}: Building 'model' from the config failed")
    assert [(r["number"], r["state"]) for r in _rows(out / "results.csv")] == [("0", "FAIL")]


def test_sweep_under_a_launcher_with_several_processes_is_refused(tmp_path, monkeypatch):
    for k, v in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(
        ConfigError,
        match="runs its trials one after another in one process, but pytorch started 2 processes; start it once",
    ):
        run_sweep(
            Config.fromfile(DIGITS),
            ["model.hidden=choice:32,64"],
            trials=2,
            metric="val/acc",
            work_dir=tmp_path / "out",
            log=None,
        )


@pytest.mark.slow
def test_a_trial_another_live_sweep_process_runs_is_left_to_it(tmp_path, one_thread):
    """Several sweep processes may share a study: a new one re-queues a RUNNING trial only once the process running
    it is gone."""
    storage = f"sqlite:///{tmp_path / 'sweep.db'}"
    args = dict(metric="val/acc", storage=storage, study_name="shared", work_dir=tmp_path / "out", log=None)
    run_sweep(_digits(**{"train_cfg.max_epochs": 1}), ["model.hidden=choice:32,64"], trials=1, **args)
    study = optuna.load_study(study_name="shared", storage=storage)
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"]
    )  # stands for the other sweep process
    try:
        running = study.ask()
        running.set_user_attr("owner", f"{socket.gethostname()}:{other.pid}")
        messages: list[str] = []
        run_sweep(
            _digits(**{"train_cfg.max_epochs": 1}),
            ["model.hidden=choice:32,64"],
            trials=2,
            **{**args, "log": messages.append},
        )
        assert study.trials[running.number].state.name == "RUNNING"  # left alone: its process lives
        assert (
            f"sweep: trial {running.number} is running in sweep process {socket.gethostname()}:{other.pid} (still "
            "alive): left to it" in messages
        )
    finally:
        other.kill()
        other.wait()
    messages.clear()
    run_sweep(
        _digits(**{"train_cfg.max_epochs": 1}),
        ["model.hidden=choice:32,64"],
        trials=3,
        **{**args, "log": messages.append},
    )
    trials = optuna.load_study(study_name="shared", storage=storage).trials
    assert trials[running.number].state.name == "FAIL"  # its process is gone: failed, its values run again
    assert any(f"trial {running.number} was running when the sweep was interrupted" in m for m in messages)
