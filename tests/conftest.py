"""Small shared models, data and a trainer factory for the core-engine tests."""

from __future__ import annotations

import itertools
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw

_names = itertools.count()

#: Whether this machine has a GPU (read once, before any test can hide it).
HAS_CUDA = torch.cuda.is_available()


#: Marks for a module whose tests compile with torch.compile (inductor on the CPU needs a C++ compiler).
NEEDS_COMPILER = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("g++") is None and shutil.which("c++") is None,
        reason="torch.compile (inductor) on CPU needs a C++ compiler; none (g++ / c++) on PATH",
    ),
    pytest.mark.usefixtures("inductor_cache"),
]


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One inductor cache folder per test module (compiled kernels are reused by its later tests)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        yield


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Tests marked ``cuda`` need a GPU: skipped without one."""
    for item in items:
        if not HAS_CUDA and item.get_closest_marker("cuda") is not None:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


@pytest.fixture(autouse=True)
def _cpu_unless_marked_cuda(request: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU machine, tests not marked ``cuda`` run as on a CPU-only one (their reference loops run on the CPU).

    The Trainer, as a user gets it, takes the GPU when there is one; these tests compare it
    with CPU tensors, so they hide the GPU from trainwright and from the processes they start.
    """
    if HAS_CUDA and request.node.get_closest_marker("cuda") is None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


class LinearReg(tw.BaseModel):
    """``y = W x + b`` with a mean-squared-error loss; deterministic, no dropout."""

    def __init__(self, d_in: int = 4, d_out: int = 1, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.linear = nn.Linear(d_in, d_out)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(d_out, d_in, generator=g))
            self.linear.bias.copy_(torch.randn(d_out, generator=g))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        out = self.linear(x)
        if mode == "loss":
            return {"loss": F.mse_loss(out, y)}
        return out


class BNReg(tw.BaseModel):
    """4 → 8 → BatchNorm → ReLU → 1 regression (MSE): a model whose BatchNorm statistics differ between data shards."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:  # noqa: D102
        pred = self.out(torch.relu(self.bn(self.fc(x))))
        return {"loss": F.mse_loss(pred, y)} if mode == "loss" else pred


class RecordLosses(tw.Hook):
    """Reference: every iteration's loss as a number (a test may sync; the engine may not)."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        self.losses[trainer.progress.iteration] = outputs["loss"].item()


def train_records(run_dir: Path) -> list[dict[str, Any]]:
    """The training records of a run folder's ``metrics.jsonl``, in order."""
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["mode"] == "train"]


def regression_set(n: int = 20, d_in: int = 4, d_out: int = 1, seed: int = 1) -> TensorDataset:
    """A random linear-regression dataset with noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, d_out, generator=g)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(n, d_out, generator=g))


def classification_set(n: int = 24, d_in: int = 4, classes: int = 3, seed: int = 2) -> TensorDataset:
    """Random features with integer labels (for Accuracy)."""
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, d_in, generator=g), torch.randint(0, classes, (n,), generator=g))


def make_trainer(
    work_dir: Path,
    model: nn.Module | None = None,
    dataset: TensorDataset | None = None,
    batch_size: int = 2,
    shuffle: bool = False,
    **kwargs: Any,
) -> tw.Trainer:
    """A quiet trainer over a small regression set; any Trainer argument can be overridden."""
    kwargs.setdefault("optim_wrapper", dict(optimizer=dict(type="SGD", lr=0.05)))
    kwargs.setdefault("train_cfg", dict(by_epoch=True, max_epochs=1))
    kwargs.setdefault("default_hooks", dict(checkpoint=None))
    kwargs.setdefault("log_level", "WARNING")
    kwargs.setdefault("randomness", dict(seed=0))
    kwargs.setdefault("experiment_name", f"run{next(_names)}")
    if "train_dataloader" not in kwargs:
        kwargs["train_dataloader"] = DataLoader(
            dataset if dataset is not None else regression_set(), batch_size=batch_size, shuffle=shuffle
        )
    return tw.Trainer(model=model if model is not None else LinearReg(), work_dir=work_dir, **kwargs)


@pytest.fixture
def trainer_factory(tmp_path: Path):
    """``trainer_factory(**Trainer kwargs)`` → a small trainer in ``tmp_path``, closed afterwards."""
    made: list[tw.Trainer] = []

    def _make(**kwargs: Any) -> tw.Trainer:
        work_dir = kwargs.pop("work_dir", tmp_path)
        t = make_trainer(work_dir, **kwargs)
        made.append(t)
        return t

    yield _make
    for t in made:
        t.close()


def params_of(model: nn.Module) -> list[torch.Tensor]:
    """Detached copies of a model's parameters, in order."""
    return [p.detach().clone() for p in model.parameters()]


#: Tensor methods that force a device→host transfer (a sync on accelerators).
SYNC_METHODS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


@pytest.fixture
def sync_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count calls of the tensor methods that read a value back to the host, by method name.

    Instrumentation of torch (not of trainwright): the code under test runs unmodified.
    """
    calls: Counter[str] = Counter()
    for name in SYNC_METHODS:
        original = getattr(torch.Tensor, name)

        def counting(self: torch.Tensor, *args: Any, _name: str = name, _orig: Any = original, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _orig(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return calls
