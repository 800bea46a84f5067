"""A compiled optimizer step (torch's "compiling the optimizer" recipe), installed by ``OptimWrapper(compile=True)``.

:class:`CompiledStep` (``torch.compile(optimizer.step)``) is set as the optimizer's ``step``, so
every caller (the strategy, a float16 ``GradScaler.step``) runs it. Each group's ``lr`` is a
0-dim tensor only while the step runs: a scheduler does not recompile it, and schedulers,
logging and checkpoints still see floats (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from trainwright.registry import check_keys

#: ``torch.compile`` arguments accepted by ``compile=dict(...)`` of an optim wrapper.
STEP_COMPILE_KEYS = frozenset({"fullgraph", "dynamic", "backend", "mode", "options", "disable"})

#: A step hook: ``hook(optimizer, args, kwargs)``, as torch's ``Optimizer.register_step_pre_hook`` / ``_post_hook`` call
#: theirs.
StepHook = Callable[[torch.optim.Optimizer, tuple[Any, ...], dict[str, Any]], None]


class CompiledStep:
    """``optimizer.step`` compiled once; callable as the step itself (``closure`` is not supported).

    Step hooks (:meth:`register_step_pre_hook` / :meth:`register_step_post_hook`) run around
    the compiled function, outside it: torch's own optimizer step hooks would be traced into
    the step and registering one would compile it again.

    A compiled step guards on Python floats, so a scheduler changing a group's ``lr`` would
    recompile it every step; torch's recipe makes ``lr`` a tensor. Here each group's ``lr`` is
    written into one 0-dim tensor per group (on the group's device) just before the step, and
    the group gets its float back just after, so checkpoints of runs with and without a
    compiled step are interchangeable. Other hyper-parameters (momentum, betas, weight decay)
    stay floats: scheduling them recompiles the step.

    Args:
        optimizer: The optimizer whose step is compiled (its class's ``step``, bound to it).
        kwargs: ``torch.compile`` arguments.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, kwargs: Mapping[str, Any] | None = None) -> None:
        self.optimizer = optimizer
        self.eager_step = optimizer.step
        self.kwargs = dict(kwargs or {})
        self._compiled = torch.compile(self.eager_step, **self.kwargs)
        self._lrs: list[torch.Tensor | None] = []
        #: True: the next calls run the optimizer's own eager step, floats as they are (see :meth:`eager`).
        self.run_eagerly = False
        self._pre_hooks: OrderedDict[int, StepHook] = OrderedDict()
        self._post_hooks: OrderedDict[int, StepHook] = OrderedDict()

    def register_step_pre_hook(self, hook: StepHook) -> RemovableHandle:
        """Run ``hook(optimizer, args, kwargs)`` before each step, outside the compiled function (no recompilation).

        The compiled counterpart of torch's ``Optimizer.register_step_pre_hook`` (which a compiled
        step guards on: registering one would compile the step again). Returns the handle that removes it.
        """
        handle = RemovableHandle(self._pre_hooks)
        self._pre_hooks[handle.id] = hook
        return handle

    def register_step_post_hook(self, hook: StepHook) -> RemovableHandle:
        """Run ``hook(optimizer, args, kwargs)`` after each step, outside the compiled function; returns the handle
        that removes it."""
        handle = RemovableHandle(self._post_hooks)
        self._post_hooks[handle.id] = hook
        return handle

    @contextlib.contextmanager
    def eager(self) -> Iterator[None]:
        """Inside, the step runs eagerly (the optimizer's own step, its ``lr`` floats untouched): e.g. one iteration
        counted by the FlopsHook."""
        before, self.run_eagerly = self.run_eagerly, True
        try:
            yield
        finally:
            self.run_eagerly = before

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Step with each group's ``lr`` as a tensor (one per group, reused: no recompilation when it changes)."""
        if args or kwargs:
            raise TypeError(
                "the compiled optimizer step takes no closure or arguments; drop optim_wrapper compile=True to pass "
                "them"
            )
        if not (self._pre_hooks or self._post_hooks):
            return self._step()
        for hook in list(self._pre_hooks.values()):
            hook(self.optimizer, args, kwargs)
        out = self._step()
        for hook in list(self._post_hooks.values()):
            hook(self.optimizer, args, kwargs)
        return out

    def _step(self) -> Any:
        """The step itself: eager (:meth:`eager`) or compiled with tensor learning rates."""
        if self.run_eagerly:
            return self.eager_step()
        groups = self.optimizer.param_groups
        lrs = self._lrs
        if len(lrs) != len(groups):  # first call, or a group was added: new tensors (compiled again once)
            lrs[:] = [_lr_tensor(g) for g in groups]
        floats = [g["lr"] for g in groups]
        for group, lr, value in zip(groups, lrs, floats):
            if lr is not None:
                lr.fill_(value)
                group["lr"] = lr
        try:
            return self._compiled()
        finally:
            for group, value in zip(groups, floats):
                group["lr"] = value

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / deepcopy without the compiled function (compiled again on unpickling)."""
        return {"optimizer": self.optimizer, "kwargs": self.kwargs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["optimizer"], state["kwargs"])  # type: ignore[misc]


def _lr_tensor(group: Mapping[str, Any]) -> torch.Tensor | None:
    """The 0-dim tensor a group's ``lr`` becomes during the step, on its parameters' device; None where torch refuses a
    tensor lr.

    torch's multi-tensor (``foreach``) implementations accept a tensor ``lr`` only when
    ``capturable``, which the compiler turns on for CUDA parameters but not on the CPU: there
    the group keeps its float (a changed ``lr`` then compiles the step again; ``foreach=False``
    avoids it).
    """
    params = group["params"]
    device = params[0].device if params else torch.device("cpu")
    if group.get("foreach") and not group.get("capturable") and device.type == "cpu":
        warnings.warn(
            "optim_wrapper compile=True with foreach=True on the CPU: torch accepts no tensor lr there, so each new lr "
            "value compiles the "
            "optimizer step again (a scheduled lr recompiles until torch's limit, then runs eagerly). Pass "
            "foreach=False to the optimizer.",
            UserWarning,
            stacklevel=4,
        )
        return None
    return torch.tensor(0.0, dtype=torch.float64, device=device)


def compile_step(optimizer: torch.optim.Optimizer, compile: bool | Mapping[str, Any]) -> CompiledStep | None:
    """Install a :class:`CompiledStep` as ``optimizer.step`` when ``compile`` asks for it; returns it (None: not
    compiled).

    Raises:
        ValueError: an unknown ``torch.compile`` argument.
    """
    if not compile:
        return None
    if isinstance(optimizer.__dict__.get("step"), CompiledStep):
        return optimizer.__dict__["step"]  # type: ignore[no-any-return]
    kwargs = dict(compile) if isinstance(compile, Mapping) else {}
    check_keys("optim_wrapper compile", kwargs, STEP_COMPILE_KEYS, ValueError)
    step = CompiledStep(optimizer, kwargs)
    vars(optimizer)["step"] = step
    return step


__all__ = ["STEP_COMPILE_KEYS", "CompiledStep", "compile_step"]
