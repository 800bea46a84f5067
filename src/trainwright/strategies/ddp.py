"""DDPStrategy: data-parallel training with torch's DistributedDataParallel.

Launch with torchrun (``torchrun --nproc_per_node=N train.py``; several machines: ``--nnodes``, ``--node_rank``,
``--rdzv_endpoint``). A model whose training forward runs through its forward caller is wrapped in DDP, so gradients
are all-reduced during the backward; a model that steps itself is not wrapped, and the strategy averages its gradients
over the ranks itself (:class:`DDPStrategy`). Every rank shares rank 0's seed; rank 0 writes checkpoints and logs.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainwright.registry import STRATEGIES
from trainwright.strategies.flat_collectives import BUCKET_BYTES, all_reduce_mean_, broadcast_, count_over_ranks
from trainwright.strategies.process_group import ProcessGroupStrategy, live_model_wrappers


@STRATEGIES.register(name=["ddp", "DDPStrategy"])
class DDPStrategy(ProcessGroupStrategy):
    """Distributed data parallel over the processes a launcher started.

    Args:
        device: Default: ``cuda:LOCAL_RANK`` when CUDA is available, else CPU.
        backend: Process-group backend; default ``"nccl"`` on CUDA, ``"gloo"`` on CPU.
        timeout_s: How long a collective may wait for the other ranks before failing.
        find_unused_parameters / broadcast_buffers / bucket_cap_mb / gradient_as_bucket_view /
            static_graph: passed to ``DistributedDataParallel``.
        detect_anomalous_params: Warn at every training forward naming the parameters the loss
            does not depend on (mmengine's; see :class:`~trainwright.model.wrappers.DistributedDataParallelWrapper`).
        sync_batchnorm: Convert the model's BatchNorm layers to ``torch.nn.SyncBatchNorm`` (batch
            statistics over every process; Lightning's ``sync_batchnorm``, mmengine's ``sync_bn='torch'``).
            torch's DDP runs SyncBatchNorm on CUDA / XPU / HPU only: on CPU (any number of
            processes) a model holding it is a ``ValueError`` at start
            (:class:`~trainwright.hooks.SyncBuffersHook` averages the running statistics instead).

    A model whose training forward runs through its forward caller (BaseModel's own ``train_step``) is wrapped in
    :class:`~trainwright.model.wrappers.DistributedDataParallelWrapper` and its training forward runs through it, so
    gradients are all-reduced during the backward; inside an accumulation window the optim wrapper enters ``no_sync``
    (one all-reduce per update, not per micro-batch).

    A model whose ``routes_train_forward()`` is False (or that has none: any model with its own
    ``train_step``, e.g. a GAN's, which calls ``self(...)`` or its submodules: forwards DDP would never see) is not
    wrapped in DDP; of the DDP arguments only ``broadcast_buffers``,
    ``bucket_cap_mb`` and ``find_unused_parameters`` apply to it (``detect_anomalous_params``
    warns that it checks nothing). Its parameters and buffers start as rank 0's, the
    gradients of each optim wrapper's parameters are averaged over the ranks before that
    wrapper's update (once per accumulation window, in buckets of ``bucket_cap_mb``, 25 MiB by
    default, after the whole backward: no overlap with it), and with ``broadcast_buffers`` the
    buffers are rank 0's after each update. ``find_unused_parameters=True`` is needed when a
    parameter may get a gradient on some ranks only (see :meth:`sync_gradients`).
    """

    name = "ddp"
    forward_is_local = True  # every rank holds the whole model: its module can be called on one rank
    backward_collective = "DDP's gradient all-reduce (inside backward)"

    def __init__(
        self,
        device: str | torch.device | None = None,
        backend: str | None = None,
        timeout_s: float = 1800.0,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool = True,
        bucket_cap_mb: float | None = None,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        detect_anomalous_params: bool = False,
        sync_batchnorm: bool = False,
    ) -> None:
        super().__init__(device, backend=backend, timeout_s=timeout_s)
        given = dict(
            find_unused_parameters=find_unused_parameters,
            broadcast_buffers=broadcast_buffers,
            gradient_as_bucket_view=gradient_as_bucket_view,
            static_graph=static_graph,
            bucket_cap_mb=bucket_cap_mb,
        )
        defaults = dict(
            find_unused_parameters=False,
            broadcast_buffers=True,
            gradient_as_bucket_view=False,
            static_graph=False,
            bucket_cap_mb=None,
        )
        #: passed to DistributedDataParallel: only what differs from its defaults (some are deprecated there)
        self.ddp_kwargs: dict[str, object] = {k: v for k, v in given.items() if v != defaults[k]}
        self.detect_anomalous_params = detect_anomalous_params
        self.sync_batchnorm = sync_batchnorm
        self.broadcast_buffers = broadcast_buffers
        #: Whether :meth:`sync_gradients` averages the gradients (the model steps itself, it is not wrapped in DDP); set
        #: by :meth:`wrap_model`.
        self.syncs_at_update = False
        self._usage_checked: weakref.WeakSet[Any] = (
            weakref.WeakSet()
        )  # the optim wrappers whose first update was checked
        self._bucket_bytes = (
            int(bucket_cap_mb * 1024 * 1024) if bucket_cap_mb else BUCKET_BYTES
        )  # of the strategy's own collectives, as DDP's buckets

    def parallelize(self, model: nn.Module) -> None:
        """With ``sync_batchnorm``, the BatchNorm layers become SyncBatchNorm in place (the same parameters and
        buffers)."""
        if not self.sync_batchnorm:
            return
        if isinstance(model, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                "sync_batchnorm=True converts the BatchNorm layers inside a model; the model itself is a BatchNorm "
                "layer: wrap it in a module"
            )
        for name, child in model.named_children():
            model.add_module(name, nn.SyncBatchNorm.convert_sync_batchnorm(child))

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """``DistributedDataParallelWrapper(model)`` (keeps ``train_step`` / ``val_step`` / ``test_step``); a model
        that steps itself: the model, with rank 0's state."""
        from trainwright.model.wrappers import DistributedDataParallelWrapper

        synced = [name for name, m in model.named_modules() if isinstance(m, nn.SyncBatchNorm)]
        if synced and self.device.type not in ("cuda", "xpu", "hpu"):
            raise ValueError(
                f"SyncBatchNorm runs on CUDA, XPU or HPU only (torch's DDP refuses it on {self.device.type}), and the "
                "model has "
                f"{len(synced)} SyncBatchNorm layer(s), e.g. {synced[0]!r}; train on GPUs, or keep BatchNorm "
                "(sync_batchnorm=False, no sync_bn) "
                "and add SyncBuffersHook to average the running statistics over the processes after each epoch"
            )
        routes = getattr(model, "routes_train_forward", None)
        self.syncs_at_update = not (callable(routes) and routes())
        self._usage_checked = weakref.WeakSet()  # a new run's wrappers are checked again
        if self.syncs_at_update:  # DDP would see none of its forwards: the strategy syncs at each update instead
            if self.detect_anomalous_params:
                warnings.warn(
                    "detect_anomalous_params=True checks the forwards that run through DDP's wrapper, and "
                    f"{type(model).__name__} steps itself "
                    "(its own train_step), so it is not wrapped and nothing is checked. A parameter no rank gives a "
                    "gradient keeps none and is "
                    "not updated; one that gets a gradient on some ranks only is named at the first update.",
                    UserWarning,
                    stacklevel=2,
                )
            broadcast_(
                [*model.parameters(), *model.buffers()], cap=self._bucket_bytes
            )  # every rank starts from rank 0's state, as DDP's constructor does
            return model
        device_ids = [self.device.index] if self.device.type == "cuda" and self.device.index is not None else None
        wrapper = DistributedDataParallelWrapper(
            model, detect_anomalous_params=self.detect_anomalous_params, device_ids=device_ids, **self.ddp_kwargs
        )  # type: ignore[arg-type]
        live_model_wrappers.add(wrapper)
        return wrapper

    def no_sync_context(self) -> Callable[[nn.Module], contextlib.AbstractContextManager] | None:
        """``model -> ddp.no_sync()``: the optim wrapper enters it inside accumulation windows."""
        wrapper = self.model
        if wrapper is None or self.syncs_at_update or not hasattr(wrapper, "no_sync"):
            return None
        return lambda _model: wrapper.no_sync()  # type: ignore[operator]

    def sync_gradients(self, optim_wrapper: Any) -> None:
        """Average the gradients of ``optim_wrapper``'s parameters over the ranks, when the model steps itself
        (:attr:`syncs_at_update`).

        Called by the optim wrapper right before its update (before unscaling and clipping), so
        every rank clips, skips an overflowed float16 step and steps alike. Gradients accumulated
        over an accumulation window are averaged once, at its end: the same as averaging each
        micro-batch's. With ``broadcast_buffers``, the model's buffers (BatchNorm statistics)
        then become rank 0's, as DDP makes them before each forward. Under DDP's wrapper
        (:attr:`syncs_at_update` False) its backward has synchronised them: nothing here.

        The parameters that have a gradient must be the same on every rank (DDP asks as much; the
        first update of each optim wrapper checks it, once, and raises naming the parameters); a
        parameter without one keeps none. With ``find_unused_parameters=True`` a parameter may
        get a gradient on some ranks only (a branch taken per sample): the ranks first count who
        has one (one small all-reduce read on the host, as DDP's ``find_unused_parameters`` does),
        the others add zeros, and a parameter no rank used keeps no gradient.
        """
        if not self.syncs_at_update:
            return
        params = [p for group in optim_wrapper.optimizer.param_groups for p in group["params"]]
        if self.ddp_kwargs.get("find_unused_parameters"):
            counts = count_over_ranks([p.grad is not None for p in params], self._comm_device)
            params = [p for p, n in zip(params, counts) if n]
            for p in params:
                if p.grad is None:  # used on another rank: this rank's share of the mean is zero
                    p.grad = torch.zeros_like(p)
        elif (
            optim_wrapper not in self._usage_checked
        ):  # once per wrapper: the ranks have gradients for the same parameters
            self._usage_checked.add(optim_wrapper)
            self._check_same_usage(params)
        all_reduce_mean_([p.grad for p in params if p.grad is not None], self.world_size, cap=self._bucket_bytes)
        if self.broadcast_buffers and self.model is not None:
            broadcast_(list(self.model.buffers()), cap=self._bucket_bytes)

    def _check_same_usage(self, params: list[torch.Tensor]) -> None:
        """Raise on every rank when a parameter has a gradient on some ranks only (their means would pair the wrong
        tensors)."""
        counts = count_over_ranks([p.grad is not None for p in params], self._comm_device)
        names = {id(p): n for n, p in self.unwrapped.named_parameters()}
        odd = [names.get(id(p), f"#{i}") for i, (p, n) in enumerate(zip(params, counts)) if 0 < n < self.world_size]
        if odd:
            raise RuntimeError(
                f"At the first update, the parameters {odd[:8]}{' and more' if len(odd) > 8 else ''} have a gradient "
                "on some processes "
                "only (the step took another branch there), so their gradients cannot be averaged tensor by tensor. "
                "Pass "
                "strategy=dict(type='ddp', find_unused_parameters=True): the ranks then agree at each update on who "
                "has one."
            )
