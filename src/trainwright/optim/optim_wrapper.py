"""OptimWrapper: backward, accumulation, clipping and the step of one optimizer (mmengine's semantics).

One fix over mmengine: the short last accumulation window is handled per epoch (the loop
calls :meth:`OptimWrapper.initialize_count_status` at each epoch start), so every epoch's tail
is stepped and scaled by its true size. There is one update path, :meth:`OptimWrapper.update_params`
(``scale_loss`` → ``backward`` → ``should_update`` → ``step`` → ``zero_grad``). The wrapper
decides *when*; its :attr:`~OptimWrapper.strategy` (an :class:`~trainwright.optim.engine.UpdateEngine`:
one process by default, the Trainer's strategy in a run) decides *how*.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from trainwright.amp.precision import MixedPrecision, Precision
from trainwright.optim.compiled_step import CompiledStep, compile_step
from trainwright.optim.counted_loss import Count, WindowItems, per_item
from trainwright.optim.engine import LOCAL, ClipFn, NoSyncContext, UpdateEngine
from trainwright.optim.spike_guard import SpikeGuard
from trainwright.optim.update_guard import NonFiniteGuard, UpdateGuard
from trainwright.registry import OPTIM_WRAPPERS, check_keys

_NULL = contextlib.nullcontext()
_NORM_KEYS = {"type", "max_norm", "norm_type", "error_if_nonfinite", "foreach"}
_VALUE_KEYS = {"type", "clip_value", "foreach"}


def _check_clip_grad(clip_grad: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if clip_grad is None:
        return None
    if not isinstance(clip_grad, Mapping):
        raise TypeError(
            f"clip_grad must be a dict like dict(max_norm=1.0) or dict(type='value', clip_value=0.5), got {clip_grad!r}"
        )
    cfg = dict(clip_grad)
    kind = cfg.get("type", "norm")
    if kind not in ("norm", "value"):
        raise ValueError(f"clip_grad type must be 'norm' or 'value', got {kind!r}")
    allowed, required = (_NORM_KEYS, "max_norm") if kind == "norm" else (_VALUE_KEYS, "clip_value")
    check_keys("clip_grad", cfg, allowed, ValueError, hint=f"Allowed for type={kind!r}: {sorted(allowed - {'type'})}")
    if required not in cfg:
        raise ValueError(f"clip_grad of type {kind!r} needs {required!r}, e.g. dict({required}=1.0)")
    for key in (required, "norm_type"):
        value = cfg.get(key)
        if key in cfg and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ValueError(
                f"clip_grad {key}={value!r} must be a number > 0 (a negative {key} turns clipping into gradient "
                f"ascent); e.g. dict({key}=1.0)"
                if key != "norm_type"
                else f"clip_grad norm_type={value!r} must be a number > 0 (2 for the Euclidean norm, float('inf') for "
                "the max norm)"
            )
    cfg["type"] = kind
    return cfg


def _clip_grad_value(
    parameters: Iterable[torch.Tensor], clip_value: float, foreach: bool | None = None
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_value_``, returning the total 2-norm of the clipped gradients (for logging)."""
    params = list(parameters)
    torch.nn.utils.clip_grad_value_(params, clip_value, foreach=foreach)
    grads = [p.grad for p in params if p.grad is not None]
    return (
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        if grads
        else torch.zeros(())
    )


def _live_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters now, over every group (also groups added after construction)."""
    return [p for g in optimizer.param_groups for p in g["params"]]


def _warn_lost_window(init_counts: int, max_counts: int, acc: int) -> None:
    done = init_counts % acc
    warnings.warn(
        f"Training resumes {done} micro-batch(es) into an accumulation window of accumulative_counts={acc} (position "
        f"{init_counts} of {max_counts}), "
        "but the gradients of those micro-batches are not here (the checkpoint was saved by a run with another "
        "accumulative_counts, or holds no "
        "'partial_grads'): this window's update uses only its remaining micro-batches. Resume with the "
        "accumulative_counts the checkpoint was "
        "saved with, or from a checkpoint saved at a multiple of it.",
        UserWarning,
        stacklevel=3,
    )


def _warn_batch_norm(model: nn.Module, acc: int) -> None:
    names = [
        n or type(model).__name__ for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]
    while names and all(
        n.startswith("module.") for n in names
    ):  # named as in the user's model, not inside DDP / adapter wrappers
        names = [n[len("module.") :] for n in names]
    if names:
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        warnings.warn(
            f"Gradient accumulation (accumulative_counts={acc}) with BatchNorm layers ({shown}): their batch "
            "statistics are computed over each "
            f"micro-batch, not over the {acc} accumulated ones, so training differs from one step on a {acc}x larger "
            "batch and may be slightly worse. "
            "Use a larger per-step batch, or GroupNorm / LayerNorm, if that matters.",
            UserWarning,
            stacklevel=3,
        )


@OPTIM_WRAPPERS.register
class OptimWrapper:
    """Wraps a ``torch.optim.Optimizer`` with accumulation, clipping and precision.

    Args:
        optimizer: The optimizer.
        accumulative_counts: Micro-batches per parameter update (>= 1).
        clip_grad: ``dict(max_norm=..., norm_type=2, error_if_nonfinite=False)`` or
            ``dict(type="value", clip_value=...)``; the total grad norm is kept in
            :attr:`grad_norm` as a tensor (no host sync). Applies to every parameter of
            every current param group.
        precision: A :class:`~trainwright.amp.precision.Precision`; full fp32 by default.
        skip_nonfinite: Skip the backward pass of micro-batches whose loss is NaN/Inf
            instead of letting them poison the weights (a :class:`~trainwright.optim.update_guard.NonFiniteGuard`
            in :attr:`update_guards`). Costs one host sync per step.
        strategy: The :class:`~trainwright.optim.engine.UpdateEngine` that carries out
            backward, clipping, the step and gradient sync; default: one process. The
            Trainer gives every wrapper its strategy.
        compile: Compile the optimizer's step (``True``, or a dict of ``torch.compile``
            arguments): torch's compiled-optimizer recipe, installed as ``optimizer.step``
            (see :mod:`trainwright.optim.compiled_step`; the learning rate is passed as a
            tensor, so schedules do not recompile it).

    Attributes:
        grad_norm: Total gradient norm of the last clipped step (a tensor), or None.
        update_guards: The ordered list of :class:`~trainwright.optim.update_guard.UpdateGuard`
            objects :meth:`update_params` asks before each backward (the first that says "skip"
            decides); empty by default. Append a guard of your own to skip updates on a condition.
        skipped_steps: Micro-batches skipped for a non-finite loss.
        skip_nonfinite: See above; may be switched at any time (adds or removes the guard).
        spike_guard: A :class:`~trainwright.optim.spike_guard.SpikeGuard`, the first of
            :attr:`update_guards` (None: none). A spike's whole accumulation window is not stepped.
        context_free: Read-only. True when :meth:`optim_context` is a no-op (full precision,
            and no gradient sync to suppress or ``accumulative_counts=1``).

    Example:
        >>> ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=4)
        >>> with ow.optim_context(model):
        ...     loss = model(x).sum()
        >>> ow.update_params(loss)
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        accumulative_counts: int = 1,
        clip_grad: Mapping[str, Any] | None = None,
        precision: Precision | None = None,
        skip_nonfinite: bool = False,
        strategy: UpdateEngine | None = None,
        compile: bool | Mapping[str, Any] = False,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"OptimWrapper needs a torch.optim.Optimizer, got {type(optimizer).__name__}; pass "
                "optimizer=dict(type='SGD', lr=...) to the Trainer to build one"
            )
        if not isinstance(accumulative_counts, int) or accumulative_counts < 1:
            raise ValueError(
                f"accumulative_counts must be an int >= 1 (1 = no accumulation), got {accumulative_counts!r}"
            )
        self.optimizer = optimizer
        self._accumulative_counts = accumulative_counts
        #: Asked in order before each backward by :meth:`update_params` (see :mod:`trainwright.optim.update_guard`).
        self.update_guards: list[UpdateGuard] = []
        self._nonfinite = NonFiniteGuard(self)  # kept while switched off: its count is skipped_steps
        self.skip_nonfinite = bool(skip_nonfinite)
        self.grad_norm: torch.Tensor | None = None
        self._spent_loss: torch.Tensor | None = (
            None  # the last back-propagated loss, kept until the next one (see backward)
        )
        self._spike_guard: SpikeGuard | None = None
        self._skip_window = False  # the spike guard skips the current accumulation window's step
        self._items = WindowItems()  # the items of the window's summed losses (update_params(num_items=...))
        # Position in the current span (see initialize_count_status).
        self._inner_count = 0
        self._max_counts = -1
        self._no_sync_context: NoSyncContext | None = LOCAL.no_sync_context()
        self._strategy: UpdateEngine = LOCAL
        self._bn_checked: nn.Module | None = None  # the model whose BatchNorm layers were looked for (once per model)
        #: With several param groups (per-parameter multipliers), a group that holds only the
        #: optimizer's defaults: schedulers move its ``lr`` like the others', and :meth:`get_lr`
        #: reports it as ``base_lr`` (mmengine's ``base_param_settings``). None otherwise.
        self.base_param_settings: dict[str, Any] | None = (
            {"params": [], **optimizer.defaults}
            if len(optimizer.param_groups) > 1 and "lr" in optimizer.defaults
            else None
        )
        self.clip_grad = clip_grad  # type: ignore[assignment]  # validated into a dict by the setter
        self.precision = precision if precision is not None else Precision()
        if strategy is not None:
            self.strategy = strategy
        #: The compiled step installed as ``optimizer.step`` (``compile=``), or None.
        self.compiled_step: CompiledStep | None = compile_step(optimizer, compile)

    # -- settings: each decides, when assigned, what the step reads ----------------------------
    @property
    def clip_grad(self) -> dict[str, Any] | None:
        """The validated clipping config, or None; assigning it chooses the clip function."""
        return self._clip_grad

    @clip_grad.setter
    def clip_grad(self, value: Mapping[str, Any] | None) -> None:
        self._clip_grad = _check_clip_grad(value)
        self._decide_clip()

    def _decide_clip(self) -> None:
        # What step calls with the parameters: the clip function with the config's arguments bound, or None.
        cfg = self._clip_grad
        clip: ClipFn | None = None
        if cfg is not None:
            clip = functools.partial(
                torch.nn.utils.clip_grad_norm_ if cfg["type"] == "norm" else _clip_grad_value,
                **{k: v for k, v in cfg.items() if k != "type"},
            )
        self._clip = clip

    @property
    def precision(self) -> Precision:
        """The :class:`~trainwright.amp.precision.Precision` used for autocast, backward and step."""
        return self._precision

    @precision.setter
    def precision(self, value: Precision) -> None:
        if not isinstance(value, Precision):
            raise TypeError(
                f"precision must be a trainwright.amp.Precision, got {type(value).__name__}; use "
                "build_precision('16-mixed'), MixedPrecision(...) or Precision() for float32"
            )
        self._precision = value
        self._decide_context_free()

    @property
    def strategy(self) -> UpdateEngine:
        """What carries out backward, clipping, the optimizer step and gradient sync (the run's strategy).

        Assigning it asks its capabilities once: the precision it needs
        (:meth:`~trainwright.optim.engine.UpdateEngine.adapt_precision`, e.g. FSDP's sharded
        GradScaler) and whether gradient sync can be suppressed inside accumulation windows.
        """
        return self._strategy

    @strategy.setter
    def strategy(self, value: UpdateEngine) -> None:
        if not isinstance(value, UpdateEngine):
            raise TypeError(f"strategy must be a trainwright Strategy (an UpdateEngine), got {type(value).__name__}")
        self._strategy = value
        self._no_sync_context = value.no_sync_context()
        self.precision = value.adapt_precision(self._precision)

    def _decide_context_free(self) -> None:
        # optim_context would return a null context (a subclass's own optim_context is always entered):
        # nothing to autocast, and no gradient sync to suppress (no switch, or no window: with
        # accumulative_counts=1 every backward closes its window and must sync).
        no_window = self._no_sync_context is None or self._accumulative_counts == 1
        self.context_free = (
            no_window and not self._precision.autocasts and type(self).optim_context is OptimWrapper.optim_context
        )

    @property
    def skip_nonfinite(self) -> bool:
        """Whether a micro-batch with a NaN/Inf loss is skipped (its
        :class:`~trainwright.optim.update_guard.NonFiniteGuard` is in :attr:`update_guards`)."""
        return any(g is self._nonfinite for g in self.update_guards)

    @skip_nonfinite.setter
    def skip_nonfinite(self, value: bool) -> None:
        if value and not self.skip_nonfinite:
            self.update_guards.append(self._nonfinite)
        elif not value:
            self.update_guards[:] = [g for g in self.update_guards if g is not self._nonfinite]

    @property
    def skipped_steps(self) -> int:
        """Micro-batches skipped for a non-finite loss (``skip_nonfinite``)."""
        return self._nonfinite.skipped

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self._nonfinite.skipped = int(value)

    @property
    def spike_guard(self) -> SpikeGuard | None:
        """The loss-spike guard, or None; assigning it puts it first in :attr:`update_guards` (in place of the
        previous one)."""
        return self._spike_guard

    @spike_guard.setter
    def spike_guard(self, value: SpikeGuard | None) -> None:
        if value is not None and not isinstance(value, SpikeGuard):
            raise TypeError(
                f"spike_guard must be a trainwright SpikeGuard or None, got {type(value).__name__}; pass "
                "Trainer(spike_guard=dict(...))"
            )
        old = self._spike_guard
        self.update_guards[:] = [g for g in self.update_guards if g is not old]
        self._spike_guard = value
        if value is not None:
            self.update_guards.insert(0, value)

    # -- the step -------------------------------------------------------------------------
    def update_params(
        self,
        loss: torch.Tensor,
        step_kwargs: dict | None = None,
        zero_kwargs: dict | None = None,
        num_items: Count | None = None,
    ) -> None:
        """Ask the :attr:`update_guards`, ``scale_loss`` → ``backward`` → if ``should_update()``: ``step`` →
        ``zero_grad``.

        ``step`` unscales (float16) and clips when clipping is on, then steps the optimizer.
        ``step_kwargs`` / ``zero_kwargs`` are passed to ``step`` / ``zero_grad``.

        A micro-batch a guard skips is counted, not back-propagated; when that guard
        ``skips_window`` (the spike guard) its whole accumulation window is not stepped. The
        guards are asked the loss's per-item mean when it comes with ``num_items``.

        ``num_items``: ``loss`` is a *sum* over that many items (tokens, say; a number or a
        one-element tensor). It is back-propagated as it is, not divided by the window's size,
        and ``step`` first divides the window's gradients by the items of the whole window over
        every rank, so the update equals one step on the per-item mean of the concatenated
        batch (:mod:`trainwright.optim.counted_loss`). A window may not mix losses with and
        without a count.
        """
        if self.update_guards and self._guarded(loss if num_items is None else per_item(loss, num_items)):
            self._inner_count += 1  # counted, not back-propagated
        else:
            self._backward_micro_batch(loss, num_items)
        if self.should_update():
            if self._skip_window:
                self._skip_window = False
            else:
                self.step(**(step_kwargs or {}))
            self.zero_grad(**(zero_kwargs or {}))

    def _guarded(self, loss: torch.Tensor) -> bool:
        """Whether a guard skips this micro-batch (the first that says so decides; one that ``skips_window`` marks
        the window)."""
        for guard in self.update_guards:
            if guard.check(loss):
                if guard.skips_window:
                    self._skip_window = True
                return True
        return False

    def _backward_micro_batch(self, loss: torch.Tensor, num_items: Count | None) -> None:
        """A mean loss: ``backward(scale_loss(loss))``; a summed one (``num_items``): ``backward(loss)``, its items
        counted once back-propagated."""
        if num_items is None:
            self._items.add_mean()
            self.backward(self.scale_loss(loss))
            return
        self.backward(loss)
        self._items.add(num_items, loss)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Divide ``loss`` by the size of its accumulation window (the short last one by its own size)."""
        acc = self._accumulative_counts
        if acc == 1:
            return loss
        n = self._inner_count
        tail = self._max_counts - (n - n % acc)  # micro-batches left in the span from this window's start
        size = tail if 0 < tail < acc else acc
        return loss if size == 1 else loss / size

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Back-propagate ``loss`` through the strategy (scaled by the GradScaler, if any) and count the micro-batch.

        The :attr:`update_guards` (``skip_nonfinite``, the spike guard) are asked by
        :meth:`update_params`, before this. The loss is kept until the next backward, as a hand-written loop's ``loss``
        variable is: its spent
        graph still holds each parameter's gradient accumulator, which the next forward reuses
        (see docs/benchmarks.md). A backward that keeps its graph (``retain_graph`` /
        ``create_graph``) is not held on to.
        """
        self._strategy.backward(loss, self, **kwargs)
        self._spent_loss = None if kwargs.get("retain_graph") or kwargs.get("create_graph") else loss
        self._inner_count += 1

    def release_graph(self) -> None:
        """Drop the loss :meth:`backward` keeps until the next one (its spent graph).

        For backward passes that were not the run's (a tuner's trials): their graph is freed now.
        """
        self._spent_loss = None

    def step(self, **kwargs: Any) -> None:
        """Synchronise the gradients (the strategy's, when its backward did not), clip when clipping is on (float16
        gradients unscaled first), then step the optimizer.

        With a GradScaler the step is skipped when gradients overflowed, and the scale adapts.
        When the window's losses carried their count (``update_params(num_items=...)``), the
        synchronised gradients are first divided by the window's items over every rank.
        """
        self._strategy.sync_gradients(self)
        if self._items.total is not None:
            self._items.normalise(_live_params(self.optimizer), self._strategy)
        if self._clip is not None:
            self._precision.unscale_(self.optimizer)
            self.grad_norm = self._strategy.clip_grad(self._clip, _live_params(self.optimizer))
        self._strategy.optimizer_step(self, **kwargs)

    def zero_grad(self, **kwargs: Any) -> None:
        """Zero (by default: set to None) the gradients, and the window's count of items with them."""
        self.optimizer.zero_grad(**kwargs)
        self._items.reset()

    # -- accumulation ---------------------------------------------------------------------
    def initialize_count_status(self, model: nn.Module | None, init_counts: int, max_counts: int) -> None:
        """Start counting micro-batches: ``init_counts`` already done out of ``max_counts``.

        Windows are ``accumulative_counts`` long and aligned to 0; the last window of the
        span (``max_counts % accumulative_counts`` long when not divisible) is scaled by its
        own size and stepped at ``max_counts``. Epoch-based loops call this at every epoch
        start with the epoch length; iteration-based loops once with ``max_iters``. The
        loop's position (``Progress``) is the source of truth: this also sets the position
        after a resume.
        """
        self._inner_count = init_counts
        self._max_counts = max_counts
        acc = self._accumulative_counts
        if acc > 1:  # nothing to check without accumulation
            inside_window = (
                init_counts % acc != 0 and init_counts != max_counts
            )  # the span's end closes its last window too
            if inside_window and not any(p.grad is not None for p in _live_params(self.optimizer)):
                _warn_lost_window(init_counts, max_counts, acc)
            if model is not None and model is not self._bn_checked:
                self._bn_checked = model
                _warn_batch_norm(model, acc)

    def should_update(self) -> bool:
        """True when the micro-batch just counted closes a window."""
        return self._inner_count % self._accumulative_counts == 0 or self._inner_count == self._max_counts

    def should_sync(self) -> bool:
        """True when the next backward closes a window (gradients must be all-reduced)."""
        nxt = self._inner_count + 1
        return nxt % self._accumulative_counts == 0 or nxt == self._max_counts

    @contextlib.contextmanager
    def _context(self, model: nn.Module) -> Iterator[None]:
        sync = self._no_sync_context if (self._no_sync_context is not None and not self.should_sync()) else None
        with sync(model) if sync is not None else _NULL, self._precision.autocast():
            yield

    def optim_context(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Context for the forward pass: no gradient sync inside a window, autocast if mixed."""
        if self.context_free:
            return _NULL
        return self._context(model)

    @property
    def inner_count(self) -> int:
        """Micro-batches counted so far in the current span."""
        return self._inner_count

    @property
    def max_counts(self) -> int:
        """Length of the current span (-1 when unknown)."""
        return self._max_counts

    @property
    def accumulative_counts(self) -> int:
        """Micro-batches per update."""
        return self._accumulative_counts

    # -- read-outs ------------------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The optimizer's parameter groups, and :attr:`base_param_settings` last when there is one (schedulers act
        on these)."""
        base = self.base_param_settings
        return self.optimizer.param_groups if base is None else [*self.optimizer.param_groups, base]

    @property
    def defaults(self) -> dict[str, Any]:
        """The optimizer's defaults."""
        return self.optimizer.defaults

    def get_lr(self) -> dict[str, list[float]]:
        """``{"lr": [lr of each param group]}``; with several groups ``{"base_lr": [the scheduled default lr], "lr":
        [...]}``.

        The logger logs the first value of each key (``base_lr`` and ``lr``), as mmengine does.
        """
        base = self.base_param_settings
        lr = [g["lr"] for g in self.optimizer.param_groups]
        return {"lr": lr} if base is None else {"base_lr": [base["lr"]], "lr": lr}

    def get_momentum(self) -> dict[str, list[float]]:
        """``{"momentum": [...]}``: ``momentum``, or ``betas[0]`` for Adam-like optimizers."""
        out = []
        for g in self.optimizer.param_groups:
            if "momentum" in g:
                out.append(g["momentum"])
            elif "betas" in g:
                out.append(g["betas"][0])
            else:
                out.append(0.0)
        return {"momentum": out}

    @property
    def loss_scale(self) -> torch.Tensor | None:
        """The float16 loss scale (a tensor), or None."""
        return self._precision.loss_scale

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Optimizer state, precision (GradScaler) state, and the gradients of an unfinished window.

        Saved inside an accumulation window, ``partial_grads`` holds the gradients accumulated
        so far for every parameter of every current param group, so a resume continues the
        window exactly. The position inside the span is not part of it: the loop's ``Progress``
        is the one record of it, and the loop hands it back through
        :meth:`initialize_count_status` (standalone users do the same after loading).
        """
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict(), "precision": self._precision.state_dict()}
        if self.base_param_settings is not None:
            state["base_param_settings"] = {k: v for k, v in self.base_param_settings.items() if k != "params"}
        if not self.should_update():
            state["partial_grads"] = [
                None if p.grad is None else p.grad.detach().clone() for p in _live_params(self.optimizer)
            ]
            state.update(self._items.state_dict())  # the items counted so far, when the losses carry their count
            if self._skip_window:
                state["skip_window"] = True  # the spike guard skips this window's step
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; a bare optimizer state dict, and mmengine's layout, are accepted too.

        mmengine's wrappers save the optimizer's own keys with ``loss_scaler`` (the GradScaler's
        state) and ``base_param_settings`` beside them: both are restored as this layout's.

        Raises:
            ValueError: ``partial_grads`` does not match the optimizer's parameters (checked
                before anything is loaded).
        """
        if "optimizer" not in state:
            bare = dict(state)
            scaler = bare.pop("loss_scaler", None)
            base = bare.pop("base_param_settings", None)
            state = {"optimizer": bare, "precision": {} if scaler is None else {"scaler": scaler}}
            if base is not None:
                state["base_param_settings"] = base
        params = _live_params(self.optimizer)
        grads = state.get("partial_grads")
        if grads is not None and len(grads) != len(params):
            raise ValueError(
                f"The checkpoint holds the gradients of an unfinished accumulation window for {len(grads)} parameters, "
                "but the optimizer's "
                f"param groups have {len(params)}; build the optimizer with the same param groups as the saved run "
                "(add groups with optimizer.add_param_group before loading), or resume from a checkpoint saved at a "
                "window boundary"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self._precision.load_state_dict(state.get("precision", {}))
        if self.base_param_settings is not None and "base_param_settings" in state:
            self.base_param_settings.update(state["base_param_settings"])  # the scheduled base lr (and its initial_lr)
        if grads is not None:
            for p, g in zip(params, grads):
                p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype).clone()
        self._skip_window = bool(state.get("skip_window", False))
        self._items.load_state_dict(state)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / deepcopy without the spent loss kept by :meth:`backward` (a graph, not state; autograd cannot
        copy it)."""
        state = self.__dict__.copy()
        state["_spent_loss"] = None
        return state

    def __repr__(self) -> str:
        compiled = "" if self.compiled_step is None else ", compile=True"
        return (
            f"{type(self).__name__}(optimizer={type(self.optimizer).__name__}, "
            f"accumulative_counts={self._accumulative_counts}, clip_grad={self.clip_grad}, "
            f"precision={self._precision.name}{compiled})"
        )


@OPTIM_WRAPPERS.register
class AmpOptimWrapper(OptimWrapper):
    """OptimWrapper with autocast mixed precision (mmengine's ``AmpOptimWrapper``).

    The same wrapper as :class:`OptimWrapper`, built with a
    :class:`~trainwright.amp.precision.MixedPrecision`: ``optim_context`` enters autocast
    (forward and loss only), ``backward`` scales the loss (float16), ``step`` unscales before
    clipping and skips the update when float16 gradients overflowed. The GradScaler state is
    part of :meth:`state_dict` (under ``"precision"``). ``Trainer(precision="16-mixed")`` with a
    plain ``OptimWrapper`` config is the same thing.

    Args:
        optimizer: The optimizer.
        dtype: ``"float16"`` (default; GradScaler: unscale before clipping, skip steps on
            inf/NaN) or ``"bfloat16"`` (autocast only, no scaler); a ``torch.dtype`` works too.
            ``"float32"`` / ``"float64"`` (mmengine accepts them): autocast to that dtype where
            torch supports it (CUDA), none elsewhere, and no GradScaler.
        loss_scale: float16 only: ``"dynamic"``, a fixed float, or a dict of GradScaler
            arguments (``init_scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``).
        device_type: Autocast / GradScaler device; by default the device of the first parameter.
        use_fsdp: mmengine's switch to a sharded GradScaler; accepted for its configs and not
            needed: under ``strategy="fsdp"`` the strategy gives the wrapper the sharded scaler.
        **kwargs: ``accumulative_counts``, ``clip_grad``, ``skip_nonfinite``, ``compile``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        dtype: str | torch.dtype | None = "float16",
        loss_scale: str | float | Mapping[str, Any] = "dynamic",
        device_type: str | None = None,
        use_fsdp: bool = False,
        **kwargs: Any,
    ) -> None:
        if "precision" in kwargs:
            raise TypeError(
                "AmpOptimWrapper builds its own precision from dtype/loss_scale; pass precision= to OptimWrapper "
                "instead, or drop it"
            )
        if device_type is None:
            params = _live_params(optimizer)
            device_type = params[0].device.type if params else "cpu"
        super().__init__(
            optimizer,
            precision=MixedPrecision("float16" if dtype is None else dtype, device_type, loss_scale),
            **kwargs,
        )
