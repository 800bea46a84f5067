"""The ``trainwright`` command: train -> test -> plot end to end, env, --nproc hand-over, and every user error."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainwright.cli import main
from trainwright.cli.run import torchrun_argv

ROOT = Path(__file__).resolve().parents[2]
DIGITS = str(ROOT / "examples" / "digits.py")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(k, None)
    return env


def _cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainwright", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _check_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 300
    assert img[..., :3].std() > 0.05  # lines, axes and labels, not a blank canvas
    assert (
        len({tuple(px) for px in img[::7, ::7, :3].reshape(-1, 3).round(2).tolist()}) > 10
    )  # several colours / shades


def test_train_test_plot_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "train",
                DIGITS,
                "--work-dir",
                "wd",
                "--cfg-options",
                "train_cfg.max_epochs=3",
                "param_scheduler.1.end=3",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    ckpt = tmp_path / "wd" / "checkpoints" / "epoch_3.pth"
    assert ckpt.is_file()
    (run,) = [p for p in (tmp_path / "wd").iterdir() if p.name != "checkpoints"]
    dumped = (run / "config.py").read_text()
    assert "'max_epochs': 3" in dumped and "'seed': 1" in dumped and "work_dir = 'wd'" in dumped
    capsys.readouterr()

    assert main(["test", DIGITS, "--work-dir", "wd", "--checkpoint", str(ckpt)]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["test/acc"] > 0.9
    assert main(["val", DIGITS, "--work-dir", "wd", "--checkpoint", str(ckpt)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["val/acc"] == pytest.approx(metrics["test/acc"])

    # a second run to compare against, then both overlaid
    assert (
        main(
            [
                "train",
                DIGITS,
                "--work-dir",
                "wd2",
                "--cfg-options",
                "train_cfg.max_epochs=2",
                "optim_wrapper.optimizer.lr=0.02",
            ]
        )
        == 0
    )
    assert main(["plot", "wd", "wd2", "--keys", "loss", "val/acc", "lr", "--out", "out/curves.png"]) == 0
    _check_png(tmp_path / "out" / "curves.png")
    assert main(["plot", "wd"]) == 0  # default keys and output
    _check_png(tmp_path / "curves.png")


def test_resume_and_load_from_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", DIGITS, "--work-dir", "wd", "--cfg-options", "train_cfg.max_epochs=1"]) == 0
    assert main(["train", DIGITS, "--work-dir", "wd", "--resume", "--cfg-options", "train_cfg.max_epochs=2"]) == 0
    log = sorted((tmp_path / "wd").glob("*/train.log"))[-1].read_text()
    assert "Resumed from" in log and "epoch_1.pth" in log
    assert (
        main(
            [
                "train",
                DIGITS,
                "--work-dir",
                "wd3",
                "--load-from",
                "wd/checkpoints/epoch_2.pth",
                "--cfg-options",
                "train_cfg.max_epochs=1",
            ]
        )
        == 0
    )
    assert (
        "Loaded weights from wd/checkpoints/epoch_2.pth"
        in sorted((tmp_path / "wd3").glob("*/train.log"))[-1].read_text()
    )


def test_python_dash_m_trains(tmp_path: Path) -> None:
    out = _cli("train", DIGITS, "--work-dir", "wd", "--cfg-options", "train_cfg.max_epochs=1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "wd" / "checkpoints" / "epoch_1.pth").is_file()


def test_env(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for key in (
        "trainwright:",
        "Python:",
        "torch:",
        "CUDA available:",
        "Distributed backends:",
        "gloo=",
        "Packages:",
        "matplotlib",
    ):
        assert key in out
    # the optional packages a run may use are listed too, installed or not
    for dist in ("wandb", "mlflow", "torchmetrics", "deepspeed", "rich", "torchao", "s3fs", "optuna"):
        assert f"{dist} " in out.split("Packages:")[1]


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


BROKEN = {
    "missing file": (lambda tmp: ["train", str(tmp / "nope.py")], r"Config file not found: '.*nope\.py'"),
    "syntax error": (
        lambda tmp: ["train", _write(tmp, "bad.py", "model = dict(\n  type='X',\n  depth=2\nlr = 1\n")],
        r"bad\.py:\d: syntax error",
    ),
    "bad override": (
        lambda tmp: ["train", DIGITS, "--cfg-options", "train_cfg.max_epochs"],
        r"--cfg-options 'train_cfg\.max_epochs' has no value: write KEY=VALUE",
    ),
    "unknown type": (
        lambda tmp: ["train", DIGITS, "--cfg-options", "model.type=DigitNet"],
        r"Building 'model' from the config failed: Unknown model type 'DigitNet'\. Did you mean "
        r"'DigitsNet'\?.*register\(\)",
    ),
    "argument type error": (
        lambda tmp: ["train", DIGITS, "--cfg-options", "model.hiden=3"],
        r"Building 'model' from the config failed: TypeError: Could not build model 'DigitsNet'.*unexpected keyword "
        r"argument 'hiden'",
    ),
    "optimizer type error at train time": (
        lambda tmp: [
            "train",
            DIGITS,
            "--work-dir",
            str(tmp / "wd"),
            "--cfg-options",
            "optim_wrapper.optimizer.lrr=0.1",
        ],
        r"Building 'optim_wrapper.optimizer' from the config failed: TypeError: .*unexpected keyword argument 'lrr'",
    ),
    "unknown key": (
        lambda tmp: ["train", DIGITS, "--cfg-options", "param_schedulr=[]"],
        r"Unknown top-level config key 'param_schedulr'\. Did you mean 'param_scheduler'",
    ),
    "bad precision": (lambda tmp: ["train", DIGITS, "--precision", "bf32"], r"Unknown precision 'bf32'"),
    "wrong launcher": (
        lambda tmp: ["train", DIGITS, "--launcher", "pytorch"],
        r"--launcher pytorch but this process was not started by it.*torchrun --nproc_per_node=N -m trainwright train",
    ),
    "no test loader": (
        lambda tmp: [
            "test",
            _write(tmp, "m.py", "import torch\nmodel = torch.nn.Linear(2, 1)\n"),
            "--checkpoint",
            "x.pth",
            "--work-dir",
            str(tmp / "wd"),
        ],
        r"test\(\) needs a test_dataloader",
    ),
    "plot nothing": (lambda tmp: ["plot", str(tmp / "nowhere")], r"'.*nowhere' does not exist"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_errors_are_short_with_nonzero_exit(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_args, pattern = BROKEN[case]
    monkeypatch.chdir(tmp_path)
    assert main(make_args(tmp_path)) == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err, flags=re.S), err
    assert "Traceback" not in err and len(err.splitlines()) <= 6


def test_errors_in_a_subprocess_and_debug(tmp_path: Path) -> None:
    out = _cli("train", str(tmp_path / "missing.py"), cwd=tmp_path)
    assert out.returncode == 2 and "Config file not found" in out.stderr and "Traceback" not in out.stderr
    out = _cli("train", str(tmp_path / "missing.py"), "--debug", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" in out.stderr and "ConfigError" in out.stderr
    out = _cli("train", cwd=tmp_path)  # argparse usage error
    assert out.returncode == 2 and "CONFIG" in out.stderr


def test_the_launcher_and_a_config_error_do_not_wait_for_torch(tmp_path: Path) -> None:
    """``train --nproc 2`` plans its torchrun launch, and a missing config is reported, without importing torch (a
    launch starts its workers one torch import sooner)."""
    code = (
        "import sys\n"
        "from trainwright.cli.main import build_parser, main\n"
        "from trainwright.cli.run import launch_plan\n"
        "assert launch_plan(build_parser().parse_args(['train', 'c.py', '--nproc', '2']), {}) == (2, 1, 0, None)\n"
        "assert main(['train', 'missing.py']) == 2\n"
        "assert 'torch' not in sys.modules, 'the launcher imported torch'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Config file not found" in out.stderr


def test_plot_unknown_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "wd" / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(
        '{"mode": "train", "epoch": 1, "iter": 1, "loss": 1.0, "lr": 0.1}\n{"mode": "val", "epoch": 1, "iter": 1, '
        '"val/acc": 0.5}\n'
    )
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "wd", "--keys", "los"]) == 2
    assert "No run logged 'los'. Did you mean 'loss'?" in capsys.readouterr().err


def test_torchrun_argv() -> None:
    argv = ["train", "cfg.py", "--nproc", "2", "--work-dir", "wd", "--launcher=none", "--cfg-options", "a=1"]
    assert torchrun_argv(argv, 2) == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "trainwright",
        "train",
        "cfg.py",
        "--work-dir",
        "wd",
        "--cfg-options",
        "a=1",
        "--launcher",
        "pytorch",
    ]
    assert torchrun_argv(["train", "c.py", "--nproc=4"], 4)[-4:] == ["train", "c.py", "--launcher", "pytorch"]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_nproc_2_hands_over_to_torch_distributed_run(tmp_path: Path) -> None:
    """``--nproc 2`` starts two processes through torch.distributed.run; they train with DDP and rank 0 checkpoints."""
    out = _cli(
        "train",
        DIGITS,
        "--nproc",
        "2",
        "--work-dir",
        "wd",
        "--cfg-options",
        "train_cfg.max_epochs=1",
        cwd=tmp_path,
        timeout=200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "wd" / "checkpoints" / "epoch_1.pth").is_file()
    assert len(list((tmp_path / "wd").glob("*/metrics.jsonl"))) == 1  # one run folder: rank 0 writes


# -- launching on clusters: the plan (fast; tests/cli/test_cluster.py runs the launches) -------
def _plan(argv: list[str], env: dict[str, str]):
    from trainwright.cli.main import build_parser
    from trainwright.cli.run import launch_plan

    return launch_plan(build_parser().parse_args(["train", "cfg.py", *argv]), env)


SLURM_TASK = {
    "SLURM_JOB_ID": "9",
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_JOB_NODELIST": "gpu[007-008]",
}
POD = {
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "8",
    "RANK": "1",
    "PET_NNODES": "2",
    "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "4",
    "PET_MASTER_ADDR": "job-master-0",
    "PET_MASTER_PORT": "23456",
}


@pytest.mark.parametrize(
    ("argv", "env", "plan"),
    [
        ([], {}, None),  # a plain run
        (["--nproc", "2"], {}, (2, 1, 0, None)),
        (
            ["--nproc", "2"],
            {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"},
            None,
        ),  # already a torchrun worker
        (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h0:29400"], {}, (1, 2, 1, "h0:29400")),
        ([], SLURM_TASK, None),  # srun started every process
        (
            ["--nproc", "4"],
            SLURM_TASK,
            (4, 2, 1, "gpu007:15009"),
        ),  # srun --ntasks-per-node=1 trainwright train --nproc 4 (port from job id 9)
        ([], POD, (4, 2, 1, "job-master-0:23456")),  # PyTorchJob with nprocPerNode: 4 processes in this pod
        (
            [],
            {k: v for k, v in POD.items() if not k.startswith("PET_")} | {"WORLD_SIZE": "2"},
            None,
        ),  # one process per pod
        (
            ["--nproc", "2"],
            {"MASTER_ADDR": "m", "MASTER_PORT": "5", "WORLD_SIZE": "3", "RANK": "2"},
            (2, 3, 2, "m:5"),
        ),  # a pod without PET_*
    ],
)
def test_launch_plan_reads_the_flags_then_the_job(argv: list[str], env: dict[str, str], plan: tuple | None) -> None:
    assert _plan(argv, env) == plan


@pytest.mark.parametrize(
    ("argv", "env", "error"),
    [
        (["--nnodes", "2", "--rdzv-endpoint", "h:1"], {}, r"--nnodes 2 needs --node-rank R"),
        (["--nnodes", "2", "--node-rank", "0"], {}, r"--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], {}, r"--node-rank 2 is outside 0\.\.1"),
        (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h"], {}, r"--rdzv-endpoint 'h' is not HOST:PORT"),
        (["--nproc", "0"], {}, r"--nproc must be at least 1"),
        (
            ["--nproc", "4"],
            {**SLURM_TASK, "SLURM_NTASKS": "8"},
            r"srun started 8 tasks on 2 nodes.*srun --ntasks-per-node=1",
        ),
        ([], {**POD, "PET_NNODES": "1:4"}, r"PET_NNODES='1:4' is not a whole number"),
    ],
)
def test_launch_plan_errors_name_the_fix(argv: list[str], env: dict[str, str], error: str) -> None:
    from trainwright.registry import ConfigError

    with pytest.raises(ConfigError, match=error):
        _plan(argv, env)


def test_torchrun_argv_for_several_nodes() -> None:
    argv = ["train", "cfg.py", "--nproc", "4", "--nnodes", "2", "--node-rank=1", "--rdzv-endpoint", "[::1]:29400"]
    assert torchrun_argv(argv, 4, 2, 1, "[::1]:29400") == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=::1",
        "--master-port=29400",
        "--nproc_per_node=4",
        "-m",
        "trainwright",
        "train",
        "cfg.py",
        "--launcher",
        "pytorch",
    ]
