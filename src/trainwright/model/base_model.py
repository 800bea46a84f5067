"""BaseModel: the contract between a model and the loops."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from trainwright.model.data_preprocessor import BaseDataPreprocessor, FollowsDevice
from trainwright.model.outputs import carries_loss, output_losses
from trainwright.optim.counted_loss import NUM_ITEMS, num_items_of, per_item
from trainwright.registry import MODELS


def _run_forward(fn: Callable[..., Any], data: Any, mode: str) -> Any:
    """``fn(**data, mode)`` for a dict batch, ``fn(*data, mode)`` for a tuple / list, else ``fn(data, mode)``.

    A ``TypeError`` / ``AttributeError`` that comes from how the batch was passed (a batch of
    three elements whose third lands in ``mode``, a single tensor that leaves the targets
    ``None``) is re-raised with what the trainer did and how to fix it; no cost otherwise.
    """
    try:
        if isinstance(data, (list, tuple)):
            return fn(*data, mode=mode)
        if isinstance(data, dict):
            return fn(**data, mode=mode)
        return fn(data, mode=mode)
    except (TypeError, AttributeError) as e:
        hint = _batch_hint(str(e), data, mode)
        if hint is None:
            raise
        raise type(e)(f"{e}\n{hint}") from e


def _batch_hint(msg: str, data: Any, mode: str) -> str | None:
    """What the trainer did with the batch, when ``msg`` (an error of the forward) points at it."""
    if (
        isinstance(data, (list, tuple))
        and len(data) != 2
        and ("argument 'mode'" in msg or "positional argument" in msg)
    ):
        return (
            f"The batch has {len(data)} elements, so the trainer called forward(*batch, mode={mode!r}): each element "
            "is one "
            "positional argument. Give forward one parameter per element (def forward(self, x, y, w, mode='tensor')), "
            "return a "
            "dict from the dataset / collate_fn (called as forward(**batch, mode=...)), or override train_step / "
            "val_step to unpack the batch."
        )
    if isinstance(data, torch.Tensor) and "NoneType" in msg:
        return (
            f"The batch is a single tensor, so the trainer called forward(batch, mode={mode!r}) and forward got no "
            "targets (its "
            "other parameters kept their defaults, e.g. None). Make the dataset return (input, target) pairs (or a "
            "dict of named "
            "fields), or compute the loss from the input alone."
        )
    return None


def _no_grad_hint(model: nn.Module, losses: Any, error: RuntimeError) -> RuntimeError:
    """torch's "does not require grad" with the loss entries that cause it and the fix."""
    entries = (
        {"loss": losses} if isinstance(losses, torch.Tensor) else dict(losses) if isinstance(losses, Mapping) else {}
    )
    cut = [k for k, v in entries.items() if "loss" in k and isinstance(v, torch.Tensor) and v.grad_fn is None]
    frozen = not any(p.requires_grad for p in model.parameters())
    return RuntimeError(
        f"{error}\nThe loss entries {cut} of {type(model).__name__}.forward(..., mode='loss') are not connected to the "
        "model's parameters"
        + (" (every parameter has requires_grad=False)" if frozen else "")
        + ": they were computed under torch.no_grad(), .detach()ed, or rebuilt from .item() / .numpy() values. "
        "Compute each loss "
        "from the model's outputs with torch operations, keep no_grad for what is only logged (a key without 'loss' is "
        "logged, "
        "not back-propagated)" + (", and unfreeze the parameters to train" if frozen else "") + "."
    )


class BaseModel(FollowsDevice):
    """A model that knows how to train, validate and test itself on one batch.

    Subclasses implement ``forward(*inputs, mode)``:

    * ``mode="loss"`` → dict of loss tensors (every key containing ``"loss"`` is summed;
      other tensors are logged only); with a ``num_items`` entry the losses are sums over
      that many items, normalised over the whole accumulation window and every rank
      (token-level losses: :mod:`trainwright.optim.counted_loss`),
    * ``mode="predict"`` → predictions (what metrics consume),
    * ``mode="tensor"`` → raw outputs.

    A tuple/list batch is passed as ``forward(*batch, mode=...)``, a dict as
    ``forward(**batch, mode=...)``, anything else as ``forward(batch, mode=...)``.

    Args:
        data_preprocessor: Moves (and normalises) the batch: an ``nn.Module`` or a ``dict(type=...)``
            of ``MODELS``; a :class:`BaseDataPreprocessor` by default.
        init_cfg: mmengine's weight-initialisation config, kept as ``self.init_cfg`` so
            OpenMMLab models construct; trainwright has no initialisers to apply it, so a
            given one warns (initialise in ``__init__``, or load weights with ``load_from``).

    Raises:
        TypeError: ``data_preprocessor`` is neither (nor builds an ``nn.Module``).
    """

    def __init__(self, data_preprocessor: nn.Module | dict | None = None, init_cfg: dict | list | None = None) -> None:
        super().__init__()
        if data_preprocessor is None:
            data_preprocessor = BaseDataPreprocessor()
        elif isinstance(data_preprocessor, Mapping):
            data_preprocessor = MODELS.build(data_preprocessor)
        if not isinstance(data_preprocessor, nn.Module):  # refused now, not as a crash in the first train_step
            raise TypeError(
                f"{type(self).__name__}(data_preprocessor=...) must be an nn.Module (e.g. "
                "trainwright.model.BaseDataPreprocessor()), a "
                "dict(type=...) of trainwright.registry.MODELS that builds one, or None; got "
                f"{type(data_preprocessor).__name__}"
            )
        self.data_preprocessor: nn.Module = data_preprocessor
        self.init_cfg = init_cfg
        if init_cfg:
            warnings.warn(
                f"{type(self).__name__}(init_cfg={init_cfg!r}) is kept as .init_cfg but not applied: trainwright does "
                "not run mmengine's "
                "weight initialisers (init_weights); initialise the layers in __init__, or load pretrained weights "
                "with "
                "Trainer(load_from=...) / trainer.load_weights(path)",
                UserWarning,
                stacklevel=2,
            )

    def forward(self, *inputs: Any, mode: str = "tensor") -> Any:  # pragma: no cover - abstract
        """Compute losses, predictions or raw outputs; see the class docstring."""
        raise NotImplementedError(f"{type(self).__name__}.forward(*inputs, mode) must be implemented")

    def train_step(self, data: Any, optim_wrapper: Any) -> dict[str, torch.Tensor]:
        """Preprocess → forward in ``"loss"`` mode under ``optim_context`` → parse losses → update params.

        The forward runs through the strategy's forward caller (:meth:`set_forward_caller`:
        its DDP wrapper, which must see the forward to synchronise gradients), else this model.

        Returns:
            The log tensors (``loss`` and each loss term) on the device, as :meth:`parse_losses`
            returns them.
        """
        with optim_wrapper.optim_context(self):
            data = self.data_preprocessor(data, True)
            losses = _run_forward(self.forward_caller or self, data, "loss")
        loss, log_vars = self.parse_losses(losses)
        num_items = num_items_of(losses)
        try:
            if num_items is None:
                optim_wrapper.update_params(loss)
            else:  # a summed loss: normalised over its whole accumulation window and every rank
                optim_wrapper.update_params(loss, num_items=num_items)
        except RuntimeError as e:
            if "does not require grad" in str(e):
                raise _no_grad_hint(self, losses, e) from e
            raise
        return log_vars

    def val_step(self, data: Any) -> Any:
        """Preprocess → forward in ``"predict"`` mode."""
        return self._run_forward(self.data_preprocessor(data, False), "predict")

    def test_step(self, data: Any) -> Any:
        """Preprocess → forward in ``"predict"`` mode."""
        return self._run_forward(self.data_preprocessor(data, False), "predict")

    def run_forward(self, data: Any, mode: str) -> Any:
        """Call this model on a preprocessed batch in ``mode``, the way the steps do.

        ``self(**data, mode=mode)`` for a dict batch, ``self(*data, mode=mode)`` for a tuple /
        list, else ``self(data, mode=mode)`` (mmengine's dispatch). Hooks and diagnostics that
        feed a batch as training does (``mode="tensor"`` for BN statistics) call this.
        """
        return _run_forward(self, data, mode)

    def _run_forward(self, data: Any, mode: str) -> Any:
        """mmengine's spelling of :meth:`run_forward`, for ported models that call or override it."""
        return self.run_forward(data, mode)

    #: What :meth:`train_step` calls for the forward pass instead of this model (see :meth:`set_forward_caller`).
    forward_caller: Callable[..., Any] | None = None

    def set_forward_caller(self, caller: Callable[..., Any] | None = None) -> None:
        """Route the training forward through ``caller`` (a strategy's DDP wrapper or DeepSpeed engine); None: this
        model.

        The strategy sets it when it wraps the model and clears it at teardown. Validation and
        testing call the model itself (never a DDP wrapper, as in mmengine). The caller is kept
        outside ``nn.Module``'s registries: a wrapper that holds this model is not its submodule.
        """
        object.__setattr__(self, "forward_caller", caller)

    def routes_train_forward(self) -> bool:
        """Whether :meth:`train_step` runs every training forward through :attr:`forward_caller`.

        The DDP strategy asks it once, when it wraps the model. True (BaseModel's own
        ``train_step``): the forward goes through the DDP wrapper, whose backward all-reduces
        the gradients while it runs. False (a subclass overrides ``train_step``: it may call
        ``self(...)``, ``self.forward(...)`` or a submodule, which DDP never sees): the strategy
        all-reduces each optim wrapper's gradients itself before its update, so the ranks stay
        in sync however the step calls the model. Override it to return True only when your
        ``train_step`` sends every forward through ``self.forward_caller or self``; that keeps
        DDP's overlap of communication with the backward.
        """
        return type(self).train_step is BaseModel.train_step

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / deepcopy without the forward caller (it refers to a wrapper of this model)."""
        state = dict(super().__getstate__())
        state.pop("forward_caller", None)
        return state

    def parse_losses(self, losses: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Sum every entry whose key contains ``"loss"``; return (total, log tensors).

        Values may be tensors or lists of tensors (each averaged then summed). Log tensors
        stay on the device: turning them into numbers is the metric store's job. They are
        detached: the store keeps them until its next flush (up to ``flush_every`` steps), and
        a kept graph, even one whose buffers backward freed, costs more per step than the copy
        (measured: see docs/benchmarks.md).

        An output that carries its loss as an attribute (Hugging Face's ``ModelOutput``; see
        :mod:`trainwright.model.outputs`) trains from ``output.loss`` alone: its logits, cache
        and hidden states are neither summed nor logged.

        A dict holding ``num_items`` reports its ``loss`` entries as sums over that many items
        (:mod:`trainwright.optim.counted_loss`): the total is that sum (``train_step`` hands the
        count to the optim wrapper, which normalises over the whole window), and the loss
        entries are logged as per-item means; ``num_items`` itself is not logged.
        """
        if isinstance(losses, torch.Tensor):
            losses = {"loss": losses}
        losses = output_losses(losses)
        if len(losses) == 1 and type(losses) is dict:  # the usual single scalar loss: nothing to sum or average
            loss = losses.get("loss")
            if isinstance(loss, torch.Tensor) and loss.dim() == 0:
                return loss, {"loss": loss.detach()}
        if not isinstance(losses, Mapping):
            raise TypeError(
                f"{type(self).__name__}.forward(..., mode='loss') must return a dict of loss tensors (or one loss "
                "tensor), "
                f"got {type(losses).__name__}; return e.g. dict(loss=F.cross_entropy(logits, y))"
            )
        log_vars: dict[str, torch.Tensor] = {}
        total = None
        n_loss = 0
        num_items = num_items_of(losses)
        for name, value in losses.items():
            if name == NUM_ITEMS and num_items is not None:
                continue
            if isinstance(value, (list, tuple)):
                value = sum(v.mean() for v in value)
            elif not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"Loss entry {name!r} must be a tensor or a list of tensors, got {type(value).__name__}"
                )
            elif value.dim():
                value = value.mean()
            if "loss" in name:
                total = value if total is None else total + value
                n_loss += 1
            log_vars[name] = value.detach()
        if total is None:
            raise ValueError(
                f"{type(self).__name__}.forward(..., mode='loss') returned no loss: keys {list(losses)} contain no "
                "'loss'. "
                "Name the loss entries e.g. 'loss' or 'loss_cls'."
            )
        if n_loss > 1 or "loss" not in log_vars:
            log_vars = {"loss": total.detach(), **log_vars}
        if num_items is not None:
            log_vars = {k: per_item(v, num_items) if "loss" in k else v for k, v in log_vars.items()}
        return total, log_vars


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
        if mode == "loss" and not isinstance(out, (torch.Tensor, Mapping)) and not carries_loss(out):
            raise TypeError(
                f"{type(self.module).__name__}.forward returned {type(out).__name__}, not a loss: a plain nn.Module "
                "used with "
                "the Trainer must return a loss tensor, a dict of losses or an output with a `loss` attribute (Hugging "
                "Face's "
                "ModelOutput); or subclass trainwright.BaseModel and implement forward(*inputs, mode) with mode='loss'."
                + (
                    " A tuple is not read by position (which element is the loss is not guessed): return "
                    "dict(loss=...), e.g. "
                    "from a BaseModel whose forward unpacks the module's (logits, loss); a Hugging Face model names "
                    "its loss with "
                    "return_dict=True, its default."
                    if isinstance(out, tuple)
                    else ""
                )
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
    if isinstance(model, BaseModel) or all(
        callable(getattr(model, m, None)) for m in ("train_step", "val_step", "test_step")
    ):
        return model  # type: ignore[return-value]
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return ModuleAdapter(model)
