"""BaseModel: the contract between a model and the loops."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _torch_module

from trainwright.model.data_preprocessor import BaseDataPreprocessor
from trainwright.registry import MODELS


def _call(fn: Any, data: Any, mode: str) -> Any:
    """``fn(**data, mode)`` for a dict batch, ``fn(*data, mode)`` for a tuple / list, else ``fn(data, mode)``."""
    if isinstance(data, dict):
        return fn(**data, mode=mode)
    if isinstance(data, (list, tuple)):
        return fn(*data, mode=mode)
    return fn(data, mode=mode)


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = tuple(getattr(_torch_module, f"_global{name}", None) for name in _HOOK_DICTS)
# The shortcut below relies on how nn.Module.__call__ decides it has nothing to do; if this torch
# lays modules out differently, it is off and every call goes through __call__.
_CAN_SKIP_CALL = all(isinstance(g, dict) for g in _GLOBAL_HOOKS) and all(k in nn.Module().__dict__ for k in _HOOK_DICTS)
_G1, _G2, _G3, _G4 = _GLOBAL_HOOKS
_tracing_state: Callable[[], Any] = torch._C._get_tracing_state  # noqa: SLF001


def call_is_forward(module: nn.Module) -> bool:
    """True when ``module(...)`` would only call ``module.forward(...)``.

    That is: no forward / backward hooks on the module or registered globally (FSDP2, for one,
    works through forward hooks), no ``module.compile()``, no TorchScript tracing. Then the
    loops call ``forward`` directly and save ``nn.Module.__call__``'s two extra Python frames.
    """
    if not _CAN_SKIP_CALL:
        return False
    d = module.__dict__
    return not (
        d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_backward_hooks"] or d["_backward_pre_hooks"]
        or d.get("_compiled_call_impl") is not None or _G1 or _G2 or _G3 or _G4 or _tracing_state()
    )


class BaseModel(nn.Module):
    """A model that knows how to train, validate and test itself on one batch.

    Subclasses implement ``forward(*inputs, mode)``:

    * ``mode="loss"`` → dict of loss tensors (every key containing ``"loss"`` is summed;
      other tensors are logged only),
    * ``mode="predict"`` → predictions (what metrics consume),
    * ``mode="tensor"`` → raw outputs.

    A tuple/list batch is passed as ``forward(*batch, mode=...)``, a dict as
    ``forward(**batch, mode=...)``, anything else as ``forward(batch, mode=...)``.

    Args:
        data_preprocessor: Moves (and normalises) the batch; a
            :class:`BaseDataPreprocessor` by default.
    """

    def __init__(self, data_preprocessor: nn.Module | dict | None = None) -> None:
        super().__init__()
        if data_preprocessor is None:
            data_preprocessor = BaseDataPreprocessor()
        elif isinstance(data_preprocessor, Mapping):
            data_preprocessor = MODELS.build(data_preprocessor)
        self.data_preprocessor = data_preprocessor

    def forward(self, *inputs: Any, mode: str = "tensor") -> Any:  # pragma: no cover - abstract
        """Compute losses, predictions or raw outputs; see the class docstring."""
        raise NotImplementedError(f"{type(self).__name__}.forward(*inputs, mode) must be implemented")

    def train_step(self, data: Any, optim_wrapper: Any) -> dict[str, torch.Tensor]:
        """Preprocess → forward (under ``optim_context``) → parse losses → update params.

        Returns:
            The log tensors (``loss`` and each loss term), detached, on the device.
        """
        # This runs every step, so it spells out what _preprocess, call_is_forward, _call and the
        # fast path of parse_losses do (each helper's Python frame measured ~1 µs per step inside a
        # training loop, several times its cost in a micro-benchmark).
        pre: Any = self._modules["data_preprocessor"]  # what nn.Module.__getattr__ would return, minus its cost
        if not getattr(pre, "passthrough", False):
            data = pre(data, True)
        d = self.__dict__
        fn = self if (  # call_is_forward(self), inline
            not _CAN_SKIP_CALL or d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_backward_hooks"] or d["_backward_pre_hooks"]
            or d.get("_compiled_call_impl") is not None or _G1 or _G2 or _G3 or _G4 or _tracing_state()
        ) else self.forward
        if getattr(optim_wrapper, "context_free", False):  # full precision, no gradient-sync switch: no context to enter
            if (type(data) is list or type(data) is tuple) and len(data) == 2:  # the usual (inputs, targets) batch
                losses = fn(data[0], data[1], mode="loss")
            else:
                losses = _call(fn, data, "loss")
        else:
            with optim_wrapper.optim_context(self):
                losses = _call(fn, data, "loss")
        # (a subclass's own parse_losses, even one patched in later, is always called)
        loss = losses.get("loss") if type(losses) is dict and len(losses) == 1 and type(self).parse_losses is _PARSE_LOSSES else None
        if type(loss) is torch.Tensor and not loss.ndim:  # parse_losses' fast path, inline: the usual single loss
            log_vars = {"loss": loss.detach()}
        else:
            loss, log_vars = self.parse_losses(losses)
        optim_wrapper.update_params(loss)
        return log_vars

    def val_step(self, data: Any) -> Any:
        """Preprocess → forward in ``"predict"`` mode."""
        return self._run_forward(self._preprocess(data, False), "predict")

    def test_step(self, data: Any) -> Any:
        """Preprocess → forward in ``"predict"`` mode."""
        return self._run_forward(self._preprocess(data, False), "predict")

    def _preprocess(self, data: Any, training: bool) -> Any:
        pre: Any = self._modules["data_preprocessor"]  # what nn.Module.__getattr__ would return, minus its cost
        return data if getattr(pre, "passthrough", False) else pre(data, training)

    def _run_forward(self, data: Any, mode: str) -> Any:
        return _call(self.forward if call_is_forward(self) else self, data, mode)

    def parse_losses(self, losses: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Sum every entry whose key contains ``"loss"``; return (total, log tensors).

        Values may be tensors or lists of tensors (each averaged then summed). Log tensors
        are detached and stay on the device: turning them into numbers is the logger's job.
        """
        if isinstance(losses, torch.Tensor):
            losses = {"loss": losses}
        if len(losses) == 1 and type(losses) is dict:  # fast path: the usual single loss
            loss = losses.get("loss")
            if isinstance(loss, torch.Tensor) and loss.dim() == 0:
                return loss, {"loss": loss.detach()}
        if not isinstance(losses, Mapping):
            raise TypeError(
                f"{type(self).__name__}.forward(..., mode='loss') must return a dict of loss tensors (or one loss tensor), "
                f"got {type(losses).__name__}; return e.g. dict(loss=F.cross_entropy(logits, y))"
            )
        log_vars: dict[str, torch.Tensor] = {}
        total = None
        n_loss = 0
        for name, value in losses.items():
            if isinstance(value, (list, tuple)):
                value = sum(v.mean() for v in value)
            elif not isinstance(value, torch.Tensor):
                raise TypeError(f"Loss entry {name!r} must be a tensor or a list of tensors, got {type(value).__name__}")
            elif value.dim():
                value = value.mean()
            if "loss" in name:
                total = value if total is None else total + value
                n_loss += 1
            log_vars[name] = value.detach()
        if total is None:
            raise ValueError(
                f"{type(self).__name__}.forward(..., mode='loss') returned no loss: keys {list(losses)} contain no 'loss'. "
                "Name the loss entries e.g. 'loss' or 'loss_cls'."
            )
        if n_loss > 1 or "loss" not in log_vars:
            log_vars = {"loss": total.detach(), **log_vars}
        return total, log_vars

    def to(self, *args: Any, **kwargs: Any) -> BaseModel:  # type: ignore[override]
        """Move the model and tell the data preprocessor its new device."""
        out = super().to(*args, **kwargs)
        device = torch._C._nn._parse_to(*args, **kwargs)[0]  # noqa: SLF001 - torch's own argument parser
        if device is not None and isinstance(self.data_preprocessor, BaseDataPreprocessor):
            self.data_preprocessor.device = torch.device(device)
        return out


_PARSE_LOSSES = BaseModel.parse_losses  # train_step inlines its fast path only for this one


class ModuleAdapter(BaseModel):
    """Lets a plain ``nn.Module`` whose forward returns a loss (or dict of losses) train.

    The wrapped module keeps its own state-dict keys (no ``module.`` prefix); predictions
    in ``val_step`` / ``test_step`` are whatever its forward returns.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        try:
            self._accepts_mode = "mode" in inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            self._accepts_mode = False

    def forward(self, *inputs: Any, mode: str = "tensor", **kwargs: Any) -> Any:
        """Call the module (passing ``mode`` only if its forward takes it)."""
        if self._accepts_mode:
            return self.module(*inputs, mode=mode, **kwargs)
        out = self.module(*inputs, **kwargs)
        if mode == "loss" and not isinstance(out, (torch.Tensor, Mapping)):
            raise TypeError(
                f"{type(self.module).__name__}.forward returned {type(out).__name__}, not a loss: a plain nn.Module used with "
                "the Trainer must return a loss tensor or a dict of losses; or subclass trainwright.BaseModel and implement "
                "forward(*inputs, mode) with mode='loss'."
            )
        return out

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        """The wrapped module's state dict (its own keys)."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:  # type: ignore[override]
        """Load into the wrapped module."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)


def as_base_model(model: nn.Module) -> BaseModel:
    """Return ``model`` if it implements the step contract, else wrap it in :class:`ModuleAdapter`."""
    if isinstance(model, BaseModel) or all(callable(getattr(model, m, None)) for m in ("train_step", "val_step", "test_step")):
        return model  # type: ignore[return-value]
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return ModuleAdapter(model)
