"""Start lean: ``import trainwright``, ``trainwright --help`` and a one-step default run load no optional package.

One fresh interpreter (``sys.modules`` of this pytest process holds whatever other tests
imported) runs the three checks in order and prints what each had loaded; the speed goals
themselves are measured by ``benchmarks/startup.py`` (docs/benchmarks.md), not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: Optional packages a run loads only when it uses them (a writer, a sweep, remote storage, a plot, a YAML config...).
OPTIONAL = (
    "tensorboard",
    "torch.utils.tensorboard",
    "wandb",
    "mlflow",
    "optuna",
    "fsspec",
    "s3fs",
    "rich",
    "matplotlib",
    "yaml",
    "transformers",
    "sklearn",
    "torchmetrics",
    "deepspeed",
    "safetensors",
    "torchdata",
    "datasets",
)

#: trainwright's own modules for what a default run does not use (other strategies, hooks that are off by default,
#: tuning, mixtures, object storage, schedulers it does not build...): a registry imports a component's module when its
#: name is looked up, and the packages' names load on first use.
NOT_DEFAULT = (
    "trainwright.strategies.ddp",
    "trainwright.strategies.fsdp",
    "trainwright.strategies.deepspeed",
    "trainwright.strategies.tensor_parallel",
    "trainwright.strategies.process_group",
    "trainwright.hooks.ema",
    "trainwright.hooks.swa",
    "trainwright.hooks.norms",
    "trainwright.hooks.profiler",
    "trainwright.hooks.precise_bn",
    "trainwright.hooks.memory",
    "trainwright.hooks.export",
    "trainwright.hooks.early_stopping",
    "trainwright.model.ema",
    "trainwright.amp.fp16_utils",
    "trainwright.tuning.lr_finder",
    "trainwright.tuning.batch_size",
    "trainwright.data.mixture",
    "trainwright.checkpoint.fsspec_store",
    "trainwright.checkpoint.export",
    "trainwright.evaluation.torchmetrics_adapter",
    "trainwright.logging.tensorboard_writer",
    "trainwright.logging.wandb_writer",
    "trainwright.logging.mlflow_writer",
    "trainwright.optim.scheduler.plateau",
    "trainwright.optim.scheduler.one_cycle",
)

_CODE = """
import contextlib, io, json, sys
OPTIONAL = {optional!r}
NOT_DEFAULT = {not_default!r}
seen = {{}}
def loaded(): return sorted(m for m in OPTIONAL if m in sys.modules)

import trainwright as tw
seen["import"] = {{"optional": loaded(), "torch": "torch" in sys.modules}}

from trainwright.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main(["--help"])
    except SystemExit as e:
        code = e.code
seen["help"] = {{"optional": loaded(), "torch": "torch" in sys.modules, "code": code, "usage": out.getvalue().startswith("usage: trainwright")}}

from trainwright.registry import METRICS
try:
    @METRICS.register()
    class Accuracy:  # a stock name: the stock metrics load first, so the clash is reported here
        pass
except KeyError as e:
    seen["clash"] = str(e)

import torch
from torch.utils.data import DataLoader, TensorDataset

class Net(tw.BaseModel):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 1)
    def forward(self, x, y, mode="tensor"):
        return {{"loss": torch.nn.functional.mse_loss(self.fc(x), y)}} if mode == "loss" else self.fc(x)

data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
trainer = tw.Trainer(model=Net(), train_dataloader=DataLoader(data, batch_size=4), work_dir={work_dir!r},
                     optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)), train_cfg=dict(by_epoch=False, max_iters=1))
trainer.train()
seen["train"] = {{"optional": loaded(), "iteration": trainer.progress.iteration,
                  "components": sorted(m for m in NOT_DEFAULT if m in sys.modules)}}

from trainwright.logging import TensorBoardWriter, WandbWriter, MlflowWriter  # public paths still import
from trainwright.registry import HOOKS
seen["public"] = {{"optional": loaded(), "writers": [c.__name__ for c in (TensorBoardWriter, WandbWriter, MlflowWriter)], "hook": type(HOOKS.build(dict(type="LoggerHook"))).__name__}}
print(json.dumps(seen))
"""


def test_import_help_and_a_default_run_load_no_optional_package(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    code = _CODE.format(optional=OPTIONAL, not_default=NOT_DEFAULT, work_dir=str(tmp_path / "work"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    seen = json.loads(res.stdout.strip().splitlines()[-1])

    assert seen["import"] == {"optional": [], "torch": False}  # the engine's names load on first use
    assert seen["help"] == {"optional": [], "torch": False, "code": 0, "usage": True}
    assert "'Accuracy' is already registered in the metric registry" in seen["clash"]
    assert seen["train"] == {
        "optional": [],
        "iteration": 1,
        "components": [],
    }  # default hooks on: console, train.log, metrics.jsonl, checkpoint...; no code of a part it does not use
    assert (tmp_path / "work" / "checkpoints" / "latest").read_text().strip() == "iter_1.pth"
    assert seen["public"] == {
        "optional": [],
        "writers": ["TensorBoardWriter", "WandbWriter", "MlflowWriter"],
        "hook": "LoggerHook",
    }


def test_every_public_name_of_a_lazy_package_loads() -> None:
    """Each name a package lists in ``__all__`` is importable from it, whether it loads at once or on first use (its
    ``if TYPE_CHECKING:`` imports are where ``utils/lazy.py`` finds its module)."""
    import importlib

    packages = (
        "trainwright.amp",
        "trainwright.data",
        "trainwright.evaluation",
        "trainwright.evaluation.metrics",
        "trainwright.hooks",
        "trainwright.logging",
        "trainwright.model",
        "trainwright.optim.scheduler",
        "trainwright.strategies",
        "trainwright.tuning",
        "trainwright.checkpoint.storage",
    )
    missing = []
    for name in packages:
        package = importlib.import_module(name)
        for attr in package.__all__:
            try:
                getattr(package, attr)
            except AttributeError:
                missing.append(f"{name}.{attr}")
        assert set(package.__all__) <= set(dir(package))
    assert missing == []
