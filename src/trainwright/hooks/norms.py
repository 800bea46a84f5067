"""NormsHook: per-layer gradient norms, parameter norms and update / parameter ratios, every ``interval`` iterations.

At a due iteration the hook registers torch's public optimizer step hooks
(``register_step_pre_hook`` / ``register_step_post_hook``) on every optimizer of the run; the
next step of each optimizer (the one that closes the due iteration's accumulation window) runs
them and they remove themselves. They compute on the device and put 0-dim tensors into the
metric store, which converts them at its next flush with the run's other numbers: no host
sync at any iteration, due or not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

from trainwright.hooks.hook import Hook
from trainwright.logging.flush_batch import Row
from trainwright.optim.compiled_step import CompiledStep
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView

#: What ``per`` may be: one number per module group, per parameter, or one per optimizer.
PER = ("module", "param", "global")

#: The parameter norm an update ratio is divided by at least (a parameter of zeros gives a finite ratio).
_TINY = 1e-12


def group_of(name: str, per: str, depth: int) -> str:
    """The group a parameter named ``name`` (as ``model.named_parameters()`` names it) is counted in.

    ``per="module"``: its module's path cut after ``depth`` parts (``blocks.0.attn.weight`` →
    ``blocks.0`` at depth 2; a parameter of the model itself keeps its own name);
    ``per="param"``: the name itself; ``per="global"``: ``"global"``.
    """
    if per == "global":
        return "global"
    if per == "param":
        return name
    parts = name.split(".")[:-1]
    return ".".join(parts[:depth]) if parts else name


def _norm(t: torch.Tensor) -> torch.Tensor:
    """The float32 2-norm of ``t`` on its device (of the whole tensor when it is a sharded DTensor: a collective)."""
    n = torch.linalg.vector_norm(t.detach(), dtype=torch.float32)
    full = getattr(n, "full_tensor", None)  # a DTensor's norm is a partial result: combine the shards' parts
    return full() if full is not None else n


def _combine(norms: Sequence[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of several tensors from their own 2-norms."""
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(list(norms)))


class _Capture:
    """One optimizer's due step: the values its pre-step hook read, until its post-step hook uses them."""

    __slots__ = ("params", "names", "grads", "weights", "before")

    def __init__(self, params: list[torch.Tensor], names: list[str]) -> None:
        self.params = params
        self.names = names
        with torch.no_grad():
            self.grads = [None if p.grad is None else _norm(p.grad) for p in params]
            self.weights = [_norm(p) for p in params]
            self.before = [p.detach().clone() for p in params]


@HOOKS.register
class NormsHook(Hook):
    """Logs per-group gradient norms, parameter norms and update ratios every ``interval`` iterations.

    Switched on with ``default_hooks=dict(norms=dict(interval=100, per="module", depth=2))``
    (off by default). For each group of parameters (see ``per``) a due step adds to the
    training records (every writer: console, ``metrics.jsonl``, TensorBoard...):

    * ``grad_norm/<group>``: the 2-norm of the group's gradients as the optimizer uses them
      (float16: unscaled; with ``clip_grad``: clipped);
    * ``param_norm/<group>``: the 2-norm of its parameters before the step;
    * ``update_ratio/<group>``: ‖θ_after − θ_before‖ / ‖θ_before‖ of that step (the
      denominator at least 1e-12).

    A group's norm is the 2-norm of all its tensors together. Computed in float32.

    The iterations: those whose run-wide number is a multiple of ``interval``. The values belong
    to the optimizer step that closes that iteration's accumulation window (the same iteration
    without accumulation) and are recorded at the step's iteration, so they appear in the log
    line that covers it. A step a float16 ``GradScaler`` skips (overflow) runs no optimizer step
    hook: the next step that is taken is measured. With several optimizers (an
    ``OptimWrapperDict``) each optimizer's parameters are measured at its own step; ``per="global"``
    then gives one group per optimizer, named by the optimizer (``grad_norm/generator``).

    A compiled optimizer step (``OptimWrapper(compile=...)``) is measured through its own step
    hooks (:meth:`~trainwright.optim.compiled_step.CompiledStep.register_step_pre_hook`), which
    run around the compiled function: torch's hooks inside it would make torch compile it again
    at every measured step. The hook never replaces ``optimizer.step``.

    Cost: at a due step, three norm kernels per parameter and a copy of the parameters
    (for the update), all on the device; nothing at other iterations. The numbers reach the
    host with the metric store's next flush (no host sync of their own).

    Args:
        interval: Iterations between measured steps (>= 1).
        per: ``"module"`` (groups by module path cut at ``depth`` parts: ``blocks.0``,
            ``blocks.1``, ``head``), ``"param"`` (every parameter by its name) or
            ``"global"`` (all parameters of an optimizer together).
        depth: Module path parts a ``per="module"`` group keeps (>= 1).
    """

    priority = "NORMAL"

    def __init__(self, interval: int = 100, per: str = "module", depth: int = 2) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(
                f"NormsHook interval must be an int >= 1 (iterations between measured steps), got {interval!r}"
            )
        if per not in PER:
            raise ValueError(
                f"NormsHook per must be one of {list(PER)} (one number per module group, per parameter, or per "
                f"optimizer), got {per!r}"
            )
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(
                "NormsHook depth must be an int >= 1 (module path parts kept: 2 makes blocks.0.attn.weight count in "
                f"'blocks.0'), got {depth!r}"
            )
        self.interval = interval
        self.per = per
        self.depth = depth
        self._handles: dict[
            str, list[RemovableHandle]
        ] = {}  # optimizer name -> its step hooks, while a due step is awaited
        self._names: dict[int, str] = {}  # id(parameter) -> its name in the model
        self._record: Callable[[Row], None] = lambda row: (
            None
        )  # the metric store's row append, set when training starts

    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._remove()
        self._names = {id(p): n for n, p in trainer.unwrapped_model.named_parameters()}
        self._record = trainer.metric_store.recorder()

    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        return self.interval

    def before_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None) -> None:
        """Arm the step hooks of every optimizer at a due iteration (not at the epoch ends the schedule also calls)."""
        it = trainer.progress.iteration + 1
        if it % self.interval or self._handles:  # not due, or the previous due window has not stepped yet
            return
        wrappers = optim_wrappers_of(trainer.optim_wrapper)
        several = len(wrappers) > 1
        for name, ow in wrappers.items():
            self._arm(trainer, name, ow.optimizer, name if several else "", getattr(ow, "compiled_step", None))

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._remove()  # a due window the run did not reach the end of

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        self._remove()

    def _arm(
        self,
        trainer: TrainerView,
        name: str,
        optimizer: torch.optim.Optimizer,
        label: str,
        compiled: CompiledStep | None = None,
    ) -> None:
        captured: list[_Capture] = []

        def pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            params = [p for g in opt.param_groups for p in g["params"]]
            captured.append(_Capture(params, [self._names.get(id(p), f"param{i}") for i, p in enumerate(params)]))

        def post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            for h in self._handles.pop(name, []):
                h.remove()
            if captured:
                values = self._values(captured.pop(), label)
                # the step runs inside the iteration; appended untimed, as the loop's rows (no flush inside the step)
                self._record((trainer.progress.iteration + 1, values, None, None))

        # A compiled step (OptimWrapper(compile=...)) guards on torch's optimizer step hooks (registering them would
        # compile it
        # again at every measured step): its own step hooks run around the compiled function instead.
        target = optimizer if compiled is None else compiled
        self._handles[name] = [target.register_step_pre_hook(pre), target.register_step_post_hook(post)]

    def _values(self, c: _Capture, label: str) -> dict[str, torch.Tensor]:
        """``grad_norm/<group>``, ``param_norm/<group>``, ``update_ratio/<group>`` of one optimizer's step, as device
        tensors."""
        groups: dict[str, list[int]] = {}
        for i, n in enumerate(c.names):
            key = label if self.per == "global" and label else group_of(n, self.per, self.depth)
            groups.setdefault(key, []).append(i)
        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            updates = [_norm(p.detach() - b) for p, b in zip(c.params, c.before)]
            c.before.clear()
            for key, idx in groups.items():
                grads = [g for g in (c.grads[i] for i in idx) if g is not None]
                if grads:
                    out[f"grad_norm/{key}"] = _combine(grads)
                weight = _combine([c.weights[i] for i in idx])
                out[f"param_norm/{key}"] = weight
                out[f"update_ratio/{key}"] = _combine([updates[i] for i in idx]) / weight.clamp_min(_TINY)
        return out

    def _remove(self) -> None:
        for handles in self._handles.values():
            for h in handles:
                h.remove()
        self._handles = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(interval={self.interval}, per={self.per!r}, depth={self.depth})"
