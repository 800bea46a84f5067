"""OptimWrapper: one object for backward, accumulation, clipping, precision and the step.

mmengine semantics, with one fix: the short last accumulation window is handled per epoch
(the loop calls :meth:`OptimWrapper.initialize_count_status` at each epoch start with the
epoch's length), so every epoch's tail is stepped and scaled by its true size.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from trainwright.amp.precision import MixedPrecision, Precision
from trainwright.registry import OPTIM_WRAPPERS, did_you_mean

_NULL = contextlib.nullcontext()
_NORM_KEYS = {"type", "max_norm", "norm_type", "error_if_nonfinite", "foreach"}
_VALUE_KEYS = {"type", "clip_value", "foreach"}


def _check_clip_grad(clip_grad: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if clip_grad is None:
        return None
    if not isinstance(clip_grad, Mapping):
        raise TypeError(f"clip_grad must be a dict like dict(max_norm=1.0) or dict(type='value', clip_value=0.5), got {clip_grad!r}")
    cfg = dict(clip_grad)
    kind = cfg.get("type", "norm")
    if kind not in ("norm", "value"):
        raise ValueError(f"clip_grad type must be 'norm' or 'value', got {kind!r}")
    allowed, required = (_NORM_KEYS, "max_norm") if kind == "norm" else (_VALUE_KEYS, "clip_value")
    for key in cfg:
        if key not in allowed:
            raise ValueError(f"Unknown clip_grad key {key!r} for type={kind!r}.{did_you_mean(key, sorted(allowed))} Allowed: {sorted(allowed - {'type'})}")
    if required not in cfg:
        raise ValueError(f"clip_grad of type {kind!r} needs {required!r}, e.g. dict({required}=1.0)")
    cfg["type"] = kind
    return cfg


@OPTIM_WRAPPERS.register
class OptimWrapper:
    """Wraps a ``torch.optim.Optimizer`` with accumulation, clipping and precision.

    Args:
        optimizer: The optimizer.
        accumulative_counts: Micro-batches per parameter update (>= 1).
        clip_grad: ``dict(max_norm=..., norm_type=2, error_if_nonfinite=False)`` or
            ``dict(type="value", clip_value=...)``; the total grad norm is kept in
            :attr:`grad_norm` as a tensor (no host sync).
        precision: A :class:`~trainwright.amp.precision.Precision`; full fp32 by default.
        skip_nonfinite: Skip the backward pass of micro-batches whose loss is NaN/Inf
            instead of letting them poison the weights. Costs one host sync per step.

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
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"OptimWrapper needs a torch.optim.Optimizer, got {type(optimizer).__name__}; pass optimizer=dict(type='SGD', lr=...) to the Trainer to build one")
        if not isinstance(accumulative_counts, int) or accumulative_counts < 1:
            raise ValueError(f"accumulative_counts must be an int >= 1 (1 = no accumulation), got {accumulative_counts!r}")
        self.optimizer = optimizer
        self._accumulative_counts = accumulative_counts
        self._plain = False
        self.context_free = True
        self._no_sync_context: Callable[[nn.Module], contextlib.AbstractContextManager] | None = None  # see no_sync_context
        self._clip_grad: dict[str, Any] | None = None
        self._precision: Precision = Precision()
        self._skip_nonfinite = False
        self.clip_grad = clip_grad  # type: ignore[assignment]
        self.precision = precision if precision is not None else Precision()
        self.skip_nonfinite = skip_nonfinite
        self.grad_norm: torch.Tensor | None = None
        self.skipped_steps = 0
        # Accumulation window bookkeeping (see initialize_count_status).
        self._inner_count = 0
        self._max_counts = -1
        self._window_start = 0
        self._divisor = accumulative_counts
        self._params = [p for g in optimizer.param_groups for p in g["params"]]

    # -- configuration that decides the fast path ------------------------------------------
    @property
    def clip_grad(self) -> dict[str, Any] | None:
        """The validated clipping config, or None."""
        return self._clip_grad

    @clip_grad.setter
    def clip_grad(self, value: Mapping[str, Any] | None) -> None:
        self._clip_grad = _check_clip_grad(value)
        self._clip_kwargs = {k: v for k, v in self._clip_grad.items() if k != "type"} if self._clip_grad else {}
        self._refresh_fast_path()

    @property
    def precision(self) -> Precision:
        """The :class:`~trainwright.amp.precision.Precision` used for autocast, backward and step."""
        return self._precision

    @precision.setter
    def precision(self, value: Precision) -> None:
        self._precision = value
        self._refresh_fast_path()

    @property
    def no_sync_context(self) -> Callable[[nn.Module], contextlib.AbstractContextManager] | None:
        """Set by a strategy that can suppress gradient sync (DDP): ``model -> context manager``."""
        return self._no_sync_context

    @no_sync_context.setter
    def no_sync_context(self, value: Callable[[nn.Module], contextlib.AbstractContextManager] | None) -> None:
        self._no_sync_context = value
        self._refresh_fast_path()

    @property
    def skip_nonfinite(self) -> bool:
        """Whether micro-batches with a NaN/Inf loss are skipped (one host sync per step)."""
        return self._skip_nonfinite

    @skip_nonfinite.setter
    def skip_nonfinite(self, value: bool) -> None:
        self._skip_nonfinite = bool(value)
        self._refresh_fast_path()

    def _refresh_fast_path(self) -> None:
        """Decide whether :meth:`update_params` may run inline, like a hand-written loop.

        True for full precision without skipping, when no subclass overrides a step method:
        then ``precision.backward`` / ``unscale_`` / ``optimizer_step`` are plain calls and the
        result is the same, minus ~10 Python calls a step.
        """
        cls = type(self)
        #: True when :meth:`optim_context` is a no-op (full precision, no gradient-sync switching):
        #: ``BaseModel.train_step`` then runs the forward pass without entering it.
        self.context_free = self._no_sync_context is None and self._precision.dtype is None and cls.optim_context is OptimWrapper.optim_context
        self._plain = (
            not self._skip_nonfinite
            and type(self._precision) is Precision
            and all(getattr(cls, m) is getattr(OptimWrapper, m) for m in ("update_params", "scale_loss", "backward", "step", "zero_grad", "should_update", "_clip_grads"))
        )

    # -- the step -------------------------------------------------------------------------
    def update_params(self, loss: torch.Tensor, step_kwargs: dict | None = None, zero_kwargs: dict | None = None) -> None:
        """Scale ``loss``, back-propagate, and at the end of a window clip, step and zero."""
        if self._plain and step_kwargs is None and zero_kwargs is None:  # same steps as below, inlined
            acc = self._accumulative_counts
            if acc != 1:
                loss = loss / self._current_divisor()
            loss.backward()
            n = self._inner_count = self._inner_count + 1
            if acc == 1 or n % acc == 0 or n == self._max_counts:
                if self._clip_grad is not None:
                    self.grad_norm = self._clip_grads()
                self.optimizer.step()
                self.optimizer.zero_grad()
            return
        if self._skip_nonfinite and not bool(torch.isfinite(loss).all()):
            self.skipped_steps += 1
            warnings.warn(f"Skipping a micro-batch with non-finite loss {loss.detach()} (skip_nonfinite=True)", RuntimeWarning, stacklevel=2)
            self._inner_count += 1
        else:
            self.backward(self.scale_loss(loss))
        if self.should_update():
            if step_kwargs:
                self.step(**step_kwargs)
            else:
                self.step()
            if zero_kwargs:
                self.zero_grad(**zero_kwargs)
            else:
                self.zero_grad()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Divide ``loss`` by the size of the current accumulation window (the short last one too)."""
        if self._accumulative_counts == 1:
            return loss
        return loss / self._current_divisor()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Back-propagate (through the precision's scaler) and count the micro-batch."""
        self._precision.backward(loss, **kwargs)
        self._inner_count += 1

    def step(self, **kwargs: Any) -> None:
        """Clip (after unscaling) and step the optimizer."""
        if self._clip_grad is not None:
            self._precision.unscale_(self.optimizer)
            self.grad_norm = self._clip_grads()
        self._precision.optimizer_step(self.optimizer, **kwargs)

    def zero_grad(self, **kwargs: Any) -> None:
        """Zero (by default: set to None) the gradients."""
        self.optimizer.zero_grad(**kwargs)

    def _clip_grads(self) -> torch.Tensor:
        cfg = self._clip_grad
        assert cfg is not None
        kwargs = self._clip_kwargs
        if cfg["type"] == "value":
            torch.nn.utils.clip_grad_value_(self._params, **kwargs)
            grads = [p.grad for p in self._params if p.grad is not None]
            return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])) if grads else torch.zeros(())
        return torch.nn.utils.clip_grad_norm_(self._params, **kwargs)

    # -- accumulation ---------------------------------------------------------------------
    def initialize_count_status(self, model: nn.Module | None, init_counts: int, max_counts: int) -> None:
        """Start counting micro-batches: ``init_counts`` already done out of ``max_counts``.

        Windows are ``accumulative_counts`` long and aligned to 0; the last window of the
        span (``max_counts % accumulative_counts`` long when not divisible) is scaled by its
        own size and stepped at ``max_counts``. Epoch-based loops call this at every epoch
        start with the epoch length; iteration-based loops once with ``max_iters``.
        """
        self._inner_count = init_counts
        self._max_counts = max_counts
        self._window_start = -1

    def _current_divisor(self) -> int:
        """Size of the window the next backward belongs to."""
        acc = self._accumulative_counts
        start = self._inner_count - self._inner_count % acc
        if start != self._window_start:
            self._window_start = start
            self._divisor = min(acc, self._max_counts - start) if self._max_counts > 0 else acc
        return self._divisor

    def should_update(self) -> bool:
        """True when the micro-batch just counted closes a window."""
        return self._inner_count % self._accumulative_counts == 0 or self._inner_count == self._max_counts

    def should_sync(self) -> bool:
        """True when the next backward closes a window (gradients must be all-reduced)."""
        nxt = self._inner_count + 1
        return nxt % self._accumulative_counts == 0 or nxt == self._max_counts

    @contextlib.contextmanager
    def _context(self, model: nn.Module) -> Iterator[None]:
        sync = self.no_sync_context if (self.no_sync_context is not None and not self.should_sync()) else None
        with (sync(model) if sync is not None else _NULL), self.precision.autocast():
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
        """The optimizer's parameter groups (schedulers act on these)."""
        return self.optimizer.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        """The optimizer's defaults."""
        return self.optimizer.defaults

    def get_lr(self) -> dict[str, list[float]]:
        """``{"lr": [lr of each param group]}``."""
        return {"lr": [g["lr"] for g in self.optimizer.param_groups]}

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
        return self.precision.loss_scale

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Optimizer state, accumulation counter and precision (GradScaler) state.

        Saved inside an accumulation window, it also holds the gradients accumulated so far,
        so a resume continues the window exactly.
        """
        state = {"optimizer": self.optimizer.state_dict(), "inner_count": self._inner_count, "max_counts": self._max_counts, "precision": self.precision.state_dict()}
        if self._inner_count % self._accumulative_counts != 0 and self._inner_count != self._max_counts:
            state["partial_grads"] = [None if p.grad is None else p.grad.detach().clone() for p in self._params]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (a bare optimizer state dict is accepted too)."""
        if "optimizer" not in state:
            self.optimizer.load_state_dict(dict(state))
            return
        self.optimizer.load_state_dict(state["optimizer"])
        self._inner_count = int(state.get("inner_count", 0))
        self._max_counts = int(state.get("max_counts", -1))
        self._window_start = -1
        self.precision.load_state_dict(state.get("precision", {}))
        grads = state.get("partial_grads")
        if grads is not None:
            if len(grads) != len(self._params):
                raise ValueError(f"Checkpoint holds partial gradients for {len(grads)} parameters but the optimizer has {len(self._params)}")
            for p, g in zip(self._params, grads):
                p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype).clone()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(optimizer={type(self.optimizer).__name__}, accumulative_counts={self._accumulative_counts}, clip_grad={self.clip_grad}, precision={self.precision.name})"


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
        loss_scale: float16 only: ``"dynamic"``, a fixed float, or a dict of GradScaler
            arguments (``init_scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``).
        device_type: Autocast / GradScaler device; by default the device of the first parameter.
        **kwargs: ``accumulative_counts``, ``clip_grad``, ``skip_nonfinite``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, dtype: str | torch.dtype | None = "float16", loss_scale: str | float | Mapping[str, Any] = "dynamic", device_type: str | None = None, **kwargs: Any) -> None:
        if "precision" in kwargs:
            raise TypeError("AmpOptimWrapper builds its own precision from dtype/loss_scale; pass precision= to OptimWrapper instead, or drop it")
        if device_type is None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            device_type = params[0].device.type if params else "cpu"
        super().__init__(optimizer, precision=MixedPrecision("float16" if dtype is None else dtype, device_type, loss_scale), **kwargs)
