"""detectron2's ``SimpleTrainer`` and ``AMPTrainer``: one loss, one optimizer, one data stream.

A different step is a subclass overriding ``run_step``, as in detectron2 (the step: :class:`SimpleTrainer`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from trainwright import dist
from trainwright.engine.events import get_event_storage
from trainwright.engine.train_loop import TrainerBase

__all__ = ["AMPTrainer", "SimpleTrainer"]


def _forever(data_loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's batches, pass after pass (detectron2's loaders are infinite; a finite one is restarted).

    Before each new pass, a sampler with ``set_epoch`` (``DistributedSampler``) is told the pass
    number, so each pass has its own order.
    """
    epoch = 0
    while True:
        sampler = getattr(data_loader, "sampler", None)
        if epoch and callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)  # type: ignore[union-attr]
        empty = True
        for batch in data_loader:
            empty = False
            yield batch
        if empty:
            raise ValueError(
                f"The data_loader ({type(data_loader).__name__}) yielded no batch: check the dataset's length and the "
                "batch size (drop_last=True with fewer samples than one batch yields none)"
            )
        epoch += 1


class SimpleTrainer(TrainerBase):
    """Train a model that returns its losses, with one optimizer, on one data stream.

    Each step, in pseudocode::

        data = next(data_iter)                     # data_time: the wait for it
        loss_dict = model(data)                    # a dict of loss tensors (or one tensor: "total_loss")
        losses = sum(loss_dict.values())
        optimizer.zero_grad(); losses.backward()   # zero_grad before the forward if asked
        trainer.after_backward()                   # hooks see the gradients
        write_metrics(loss_dict, data_time)        # every gather_metric_period steps: mean over ranks
                                                   #   (data_time: max), NaN/Inf -> FloatingPointError
        optimizer.step()

    Args:
        model: Called as ``model(data)`` with each batch; returns a dict of scalar loss
            tensors (every entry is summed) or one loss tensor. Put in training mode here.
        data_loader: Any iterable of batches; a finite one is iterated again when exhausted.
        optimizer: A ``torch.optim.Optimizer``.
        gather_metric_period: Write (and reduce over ranks) the losses every this many
            iterations; the NaN/Inf check runs at those iterations too.
        zero_grad_before_forward: Zero the gradients before the forward instead of after it.
        async_write_metrics: Not provided (metrics are written in the step); must be False.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        gather_metric_period: int = 1,
        zero_grad_before_forward: bool = False,
        async_write_metrics: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(gather_metric_period, int) or gather_metric_period < 1:
            raise ValueError(
                "gather_metric_period must be an int >= 1 (write the losses every N iterations), got "
                f"{gather_metric_period!r}"
            )
        if async_write_metrics:
            raise ValueError(
                "async_write_metrics=True is not provided by trainwright.engine: the losses are reduced and checked in "
                "the step. "
                "Pass gather_metric_period=N to write them every N iterations instead"
            )
        model.train()
        self.model = model
        self.data_loader = data_loader
        self.optimizer = optimizer
        self.gather_metric_period = gather_metric_period
        self.zero_grad_before_forward = zero_grad_before_forward
        self._data_iter: Iterator[Any] | None = None

    @property
    def _data_loader_iter(self) -> Iterator[Any]:
        """The one iterator over the data, created on first use and kept across ``train()`` calls (detectron2's
        name)."""
        if self._data_iter is None:
            self._data_iter = _forever(self.data_loader)
        return self._data_iter

    def reset_data_loader(self, data_loader_builder: Callable[[], Iterable[Any]]) -> None:
        """Replace the data loader with ``data_loader_builder()``; the next step starts iterating the new one."""
        self.data_loader = data_loader_builder()
        self._data_iter = None

    def _next_data(self) -> tuple[Any, float]:
        if not self.model.training:
            raise RuntimeError(
                f"[{type(self).__name__}] the model was put in eval mode (model.eval()) during training; call "
                "model.train() after evaluating"
            )
        start = time.perf_counter()
        data = next(self._data_loader_iter)
        return data, time.perf_counter() - start

    @staticmethod
    def _sum_losses(
        loss_dict: torch.Tensor | Mapping[str, torch.Tensor],
    ) -> tuple[Mapping[str, torch.Tensor], torch.Tensor]:
        if isinstance(loss_dict, torch.Tensor):
            return {"total_loss": loss_dict}, loss_dict
        if not isinstance(loss_dict, Mapping) or not loss_dict:
            raise TypeError(
                "The model must return a dict of loss tensors or one loss tensor in training mode, got "
                f"{type(loss_dict).__name__}"
                f"{' (empty)' if isinstance(loss_dict, Mapping) else ''}; return e.g. {{'loss_cls': ..., 'loss_box': "
                f"...}}"
            )
        return loss_dict, sum(loss_dict.values())  # type: ignore[return-value]

    def run_step(self) -> None:
        """One step: data, forward, zero_grad, backward, ``after_backward`` hooks, metrics, optimizer step."""
        data, data_time = self._next_data()
        if self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        loss_dict, losses = self._sum_losses(self.model(data))
        if not self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        losses.backward()
        self.after_backward()
        self._write_metrics(loss_dict, data_time)
        self.optimizer.step()

    def _write_metrics(
        self, loss_dict: Mapping[str, torch.Tensor], data_time: float, prefix: str = "", iter: int | None = None
    ) -> None:
        """:meth:`write_metrics` at iterations ``N - 1, 2N - 1, ...`` (``N = gather_metric_period``), as in
        detectron2."""
        cur = self.iter if iter is None else iter
        if (cur + 1) % self.gather_metric_period == 0:
            self.write_metrics(loss_dict, data_time, cur, prefix)

    @staticmethod
    def write_metrics(loss_dict: Mapping[str, torch.Tensor], data_time: float, cur_iter: int, prefix: str = "") -> None:
        """Put the losses (mean over ranks), their sum ``total_loss`` and ``data_time`` (max over ranks) in the current
        storage.

        Every rank reduces and puts the same numbers (detectron2 gathers to rank 0, which alone
        writes); each rank's own wait is ``rank_data_time``. One host sync per call.

        Raises:
            FloatingPointError: the reduced total is NaN or infinite, naming the iteration and
                the losses; raised on every rank at once, before the optimizer step.
        """
        storage = get_event_storage()
        storage.put_scalar("rank_data_time", data_time, cur_iter=cur_iter)
        names = list(loss_dict)
        first = next(iter(loss_dict.values()))
        device = first.device if isinstance(first, torch.Tensor) else torch.device("cpu")
        values = torch.stack(
            [torch.as_tensor(v, device=device).detach().float().reshape(()) for v in loss_dict.values()]
        )
        reduced = dist.all_reduce(values, "mean").tolist()
        data_time = dist.all_reduce(torch.tensor([data_time], dtype=torch.float64, device=device), "max").item()
        storage.put_scalar("data_time", data_time, cur_iter=cur_iter)
        metrics = dict(zip(names, reduced))
        total = sum(metrics.values())
        if not math.isfinite(total):
            raise FloatingPointError(
                f"Loss became infinite or NaN at iteration={cur_iter}!\nloss_dict = {metrics}\n"
                "Lower the learning rate, clip gradients in an after_backward hook "
                "(torch.nn.utils.clip_grad_norm_(self.trainer.model.parameters(), 1.0)), or check the data for NaN/Inf"
            )
        storage.put_scalar(f"{prefix}total_loss", total, cur_iter=cur_iter)
        if len(metrics) > 1:
            storage.put_scalars(cur_iter=cur_iter, **metrics)

    def state_dict(self) -> dict[str, Any]:
        """The trainer's state (iteration, hooks) and the optimizer's (``"optimizer"``)."""
        return {**super().state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the iteration, the hooks' states and the optimizer."""
        super().load_state_dict(state_dict)
        self.optimizer.load_state_dict(state_dict["optimizer"])


def _device_type(model: torch.nn.Module) -> str:
    param = next(model.parameters(), None)
    return param.device.type if param is not None else "cpu"


class AMPTrainer(SimpleTrainer):
    """:class:`SimpleTrainer` with the forward under ``torch.autocast`` and a ``GradScaler`` around backward and step.

    Unlike detectron2's, it runs on the CPU too (autocast on the model's device type).

    Args:
        model, data_loader, optimizer, gather_metric_period, zero_grad_before_forward: As
            for :class:`SimpleTrainer`.
        grad_scaler: A ``torch.amp.GradScaler``. Default: one for the model's device, enabled
            for ``torch.float16`` only (bfloat16 gradients do not underflow; a disabled scaler
            passes the loss and the step through unchanged).
        precision: The autocast dtype, ``torch.float16`` or ``torch.bfloat16``.
        log_grad_scaler: Put the scaler's scale as ``[metric]grad_scaler`` every step (a host sync).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data_loader: Iterable[Any],
        optimizer: torch.optim.Optimizer,
        gather_metric_period: int = 1,
        zero_grad_before_forward: bool = False,
        grad_scaler: torch.amp.GradScaler | None = None,
        precision: torch.dtype = torch.float16,
        log_grad_scaler: bool = False,
        async_write_metrics: bool = False,
    ) -> None:
        if precision not in (torch.float16, torch.bfloat16):
            raise ValueError(
                f"AMPTrainer precision must be torch.float16 or torch.bfloat16, got {precision!r}; for float32 use "
                "SimpleTrainer"
            )
        if isinstance(model, torch.nn.DataParallel):
            raise TypeError(
                "AMPTrainer does not support torch.nn.DataParallel (one process driving several devices); use "
                "DistributedDataParallel, one process per device"
            )
        super().__init__(
            model, data_loader, optimizer, gather_metric_period, zero_grad_before_forward, async_write_metrics
        )
        self.device_type = _device_type(model)
        self.grad_scaler = (
            grad_scaler
            if grad_scaler is not None
            else torch.amp.GradScaler(self.device_type, enabled=precision == torch.float16)
        )
        self.precision = precision
        self.log_grad_scaler = log_grad_scaler

    def run_step(self) -> None:
        """One step as :meth:`SimpleTrainer.run_step`, the forward under autocast, backward and step through the
        scaler."""
        data, data_time = self._next_data()
        if self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        with torch.autocast(self.device_type, dtype=self.precision):
            loss_dict, losses = self._sum_losses(self.model(data))
        if not self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        self.grad_scaler.scale(losses).backward()
        if self.log_grad_scaler:
            self.storage.put_scalar("[metric]grad_scaler", self.grad_scaler.get_scale())
        self.after_backward()
        self._write_metrics(loss_dict, data_time)
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()

    def state_dict(self) -> dict[str, Any]:
        """:meth:`SimpleTrainer.state_dict` and the scaler's (``"grad_scaler"``)."""
        return {**super().state_dict(), "grad_scaler": self.grad_scaler.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        super().load_state_dict(state_dict)
        self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
