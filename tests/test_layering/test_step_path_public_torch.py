"""The step path reads no private attribute of a torch object (or of anything but its own ``self``).

One training iteration runs through the functions listed here: the model's step, the optim
wrapper's update, the precision and every registered strategy's step methods. Each is read as
source and every ``<expression>._name`` whose expression is not the bare ``self`` / ``cls`` is
refused: ``module._forward_hooks``, ``torch._C._get_tracing_state()``, ``scaler._scale``...
(torch may rename those in any release). Our own objects' underscored attributes are read
through their own methods.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

import trainwright.strategies  # noqa: F401  - registers every strategy
from trainwright.amp.precision import MixedPrecision, Precision
from trainwright.loops import train_loop
from trainwright.model import base_model, data_preprocessor
from trainwright.model.wrappers import DistributedDataParallelWrapper
from trainwright.optim.engine import UpdateEngine
from trainwright.optim.optim_wrapper import OptimWrapper
from trainwright.registry import STRATEGIES
from trainwright.strategies.process_group import ProcessGroupStrategy

_STEP_METHODS = ("backward", "clip_grad", "optimizer_step", "no_sync_context", "adapt_precision")


def _step_path() -> dict[str, Callable[..., Any]]:
    fns: dict[str, Callable[..., Any]] = {
        "BaseModel.train_step": base_model.BaseModel.train_step,
        "BaseModel.parse_losses": base_model.BaseModel.parse_losses,
        "base_model._run_forward": base_model._run_forward,
        "BaseDataPreprocessor.forward": data_preprocessor.BaseDataPreprocessor.forward,
        "cast_data": data_preprocessor.cast_data,
        "DistributedDataParallelWrapper.train_step": DistributedDataParallelWrapper.train_step.fget,  # type: ignore[attr-defined]
    }
    for name in (
        "update_params",
        "scale_loss",
        "backward",
        "step",
        "zero_grad",
        "should_update",
        "should_sync",
        "optim_context",
        "_context",
        "initialize_count_status",
    ):
        fns[f"OptimWrapper.{name}"] = getattr(OptimWrapper, name)
    for cls in (Precision, MixedPrecision):
        for name in ("autocast", "backward", "unscale_", "optimizer_step"):
            fns[f"{cls.__name__}.{name}"] = getattr(cls, name)
    strategies = {UpdateEngine, ProcessGroupStrategy, *(STRATEGIES.get(n) for n in STRATEGIES.names())}
    for cls in strategies:
        for name in _STEP_METHODS:
            fn = cls.__dict__.get(name)
            if fn is not None:
                fns[f"{cls.__name__}.{name}"] = fn
    for name, obj in vars(train_loop).items():  # the loops' per-iteration code
        if inspect.isclass(obj) and obj.__module__ == train_loop.__name__:
            for attr, fn in vars(obj).items():
                if inspect.isfunction(fn) and "iter" in attr:
                    fns[f"{name}.{attr}"] = fn
    return fns


def private_reads(fn: Callable[..., Any]) -> list[str]:
    """``expression._name`` reads in ``fn``'s source whose expression is not the bare ``self`` / ``cls``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not (node.attr.startswith("__") and node.attr.endswith("__"))
        ):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_checker_catches_a_private_torch_read() -> None:
    def sneaky(module: Any) -> bool:
        return bool(module._forward_hooks) or module.__class__ is None

    assert private_reads(sneaky) == ["line 2: module._forward_hooks"]


@pytest.mark.parametrize("name", sorted(_step_path()))
def test_the_step_path_reads_no_private_attribute(name: str) -> None:
    reads = private_reads(_step_path()[name])
    assert not reads, (
        f"{name} reads private attributes: {reads}. Use torch's public API (docs/architecture.md lists the few "
        "exceptions, none on the step path)."
    )
