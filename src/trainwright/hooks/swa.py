"""SWAHook: stochastic weight averaging as torch's ``swa_utils`` recipe (the average, ``SWALR``, ``update_bn``); the run
    ends with the averaged model.

From ``begin_epoch`` on, each epoch's end folds the weights into an equal-weight running mean of
the parameters (what torch's ``AveragedModel`` keeps for SWA; per shard under FSDP) and steps a
``SWALR`` schedule per optimizer. After the last epoch the average is copied into the model and
its BatchNorm statistics are recomputed over the training data (as ``torch.optim.swa_utils.update_bn``),
before the final validation and checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim.swa_utils import SWALR

from trainwright.dist.shards import load_into, locals_of
from trainwright.hooks.bn_stats import forward_for_stats, update_bn
from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


class Average:
    """The equal-weight running mean of a model's parameters: what torch's ``AveragedModel`` keeps for SWA
    (``use_buffers=False``).

    The first :meth:`update` copies the parameters; the n-th (n > 1) moves the average by
    1/n towards them (``torch._foreach_lerp_``). The tensors are the parameters' own kind: under
    FSDP each process keeps and updates its shards (no communication), and a sharded checkpoint
    writes them with the model's shards (DCP).
    """

    def __init__(self, model: nn.Module) -> None:
        named = list(model.named_parameters())
        #: The parameters' names, in ``model.parameters()`` order.
        self.names = [n for n, _ in named]
        with torch.no_grad():
            self.tensors = [p.detach().clone() for _, p in named]
        #: How many updates the average holds (torch's ``AveragedModel.n_averaged``, a Python int here).
        self.n_averaged = 0

    def update(self, model: nn.Module) -> None:
        """Fold ``model``'s current parameters into the average."""
        avg, cur = locals_of(self.tensors), locals_of([p.detach() for p in model.parameters()])
        with torch.no_grad():
            if self.n_averaged == 0:
                torch._foreach_copy_(avg, cur)
            else:
                torch._foreach_lerp_(avg, cur, 1.0 / (self.n_averaged + 1))
        self.n_averaged += 1

    def copy_to(self, model: nn.Module) -> None:
        """Write the averaged parameters into ``model``."""
        with torch.no_grad():
            torch._foreach_copy_(locals_of([p.detach() for p in model.parameters()]), locals_of(self.tensors))

    def state_dict(self) -> dict[str, Any]:
        """``{"params": {name: tensor}, "n_averaged": int}``: references, as ``nn.Module.state_dict`` (DTensors under
        FSDP; the params load into the model with ``strict=False``)."""
        return {"params": dict(zip(self.names, self.tensors)), "n_averaged": self.n_averaged}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state (into this process's shards under FSDP).

        Raises:
            KeyError: the saved parameter names differ from the model's (names the differences).
        """
        saved = state["params"]
        if list(saved) != self.names:
            missing, unexpected = sorted(set(self.names) - set(saved)), sorted(set(saved) - set(self.names))
            raise KeyError(
                f"SWAHook: the saved average does not match the model (missing {missing}, unexpected {unexpected}); "
                "resume with the model it was saved from"
            )
        for t, name in zip(self.tensors, self.names):
            load_into(t, saved[name])
        self.n_averaged = int(state["n_averaged"])


@HOOKS.register
class SWAHook(Hook):
    """Stochastic weight averaging (Izmailov et al., 2018) as torch's ``swa_utils`` recipe, in an epoch-based run.

    torch's loop, which this hook carries out::

        swa_model = AveragedModel(model)
        for epoch in range(max_epochs):
            if epoch == begin_epoch - 1: swa_scheduler = SWALR(optimizer, swa_lr, anneal_epochs, anneal_strategy)
            train_one_epoch()
            if epoch >= begin_epoch - 1:
                swa_model.update_parameters(model)
                swa_scheduler.step()
        update_bn(train_loader, swa_model)

    The averaged model is what the run ends with: after the last epoch's average update the
    BatchNorm statistics of the average are recomputed over the training data (each batch
    through the model's data preprocessor, ``mode="tensor"``), and the averaged parameters and
    BatchNorm statistics are copied into ``trainer.unwrapped_model`` for good. The final
    validation, the final checkpoint (``model``) and a later ``trainer.test()`` therefore use the
    averaged weights. Validations before the end evaluate the training weights (an average
    whose BatchNorm statistics are not recomputed would evaluate wrongly). A run stopped early
    (a stop request, early stopping) gets the same treatment at its end, once averaging began.

    The ``SWALR`` schedule moves each param group's ``lr`` to ``swa_lr`` over ``anneal_epochs``
    epochs; other parameter schedulers must end before ``begin_epoch`` (a scheduler still
    running would fight it: the hook says so when training starts). With several optimizers
    (``OptimWrapperDict``) each gets its own ``SWALR``.

    Resume is exact: checkpoints hold the averaged parameters, ``n_averaged``, each
    ``SWALR``'s state and whether the average was applied (the hook's ``state_dict``).

    Args:
        begin_epoch: The 1-based epoch at whose end the first average update happens (>= 1).
        swa_lr: The learning rate SWALR anneals to (a number, or one per param group).
        anneal_epochs: Epochs of annealing from the current lr to ``swa_lr`` (0: at once).
        anneal_strategy: ``"cos"`` or ``"linear"``.
    """

    priority = "NORMAL"  # at an epoch's end, before the checkpoint hook (VERY_LOW) saves it

    def __init__(
        self, begin_epoch: int, swa_lr: float | list[float], anneal_epochs: int = 10, anneal_strategy: str = "cos"
    ) -> None:
        if isinstance(begin_epoch, bool) or not isinstance(begin_epoch, int) or begin_epoch < 1:
            raise ValueError(
                "SWAHook begin_epoch must be an int >= 1 (the 1-based epoch whose end makes the first average "
                f"update), got {begin_epoch!r}"
            )
        if isinstance(anneal_epochs, bool) or not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"SWAHook anneal_epochs must be an int >= 0, got {anneal_epochs!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"SWAHook anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        lrs = swa_lr if isinstance(swa_lr, (list, tuple)) else [swa_lr]
        if not lrs or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in lrs):
            raise ValueError(
                f"SWAHook swa_lr must be a number > 0 or a list of them (one per param group), got {swa_lr!r}"
            )
        self.begin_epoch = begin_epoch
        self.swa_lr = swa_lr
        self.anneal_epochs = anneal_epochs
        self.anneal_strategy = anneal_strategy
        #: The average (:class:`Average`), built when training starts.
        self.averaged: Average | None = None
        #: One ``SWALR`` per optimizer (``""`` for a single one), built when averaging begins.
        self.schedulers: dict[str, SWALR] = {}
        #: Whether the average has been copied into the model (the run's end).
        self.applied = False
        self._pending: Mapping[str, Any] | None = None
        self._max_epochs = 0

    def before_train(self, trainer: TrainerView) -> None:
        """Check the run (epoch-based, long enough, no scheduler past ``begin_epoch``); build the average (and resume
        it)."""
        loop = require_train_loop(trainer, "SWAHook.before_train")
        if not loop.by_epoch:
            raise ValueError(
                "SWAHook averages once per epoch with a per-epoch SWALR schedule: use an epoch-based run, "
                "train_cfg=dict(by_epoch=True, max_epochs=...)"
            )
        self._max_epochs = int(getattr(loop, "max_epochs"))  # noqa: B009 (an epoch-based loop has it; TrainLoopView does not declare it)
        if self.begin_epoch > self._max_epochs:
            raise ValueError(
                f"SWAHook begin_epoch={self.begin_epoch} starts averaging after epoch {self.begin_epoch}, but the run "
                f"has {self._max_epochs} epochs: "
                "the average would never be updated. Lower begin_epoch or train longer"
            )
        self._warn_schedulers(trainer, len(loop.dataloader))
        if self.averaged is None:
            self.averaged = Average(trainer.unwrapped_model)
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.averaged.load_state_dict(pending["averaged"])
            self.applied = bool(pending.get("applied", False))
            saved = pending.get("schedulers") or {}
            if saved:
                self._build_schedulers(trainer)
                for name, sched in self.schedulers.items():
                    sched.load_state_dict(saved[name])

    def before_train_epoch(self, trainer: TrainerView) -> None:
        """At the start of ``begin_epoch`` (or later, resumed without a schedule): build the SWALR schedules."""
        if trainer.progress.epoch + 1 >= self.begin_epoch and not self.schedulers:
            self._build_schedulers(trainer)

    def after_train_epoch(self, trainer: TrainerView) -> None:
        """Fold the weights into the average and step SWALR; after the last epoch, apply the average."""
        epoch = trainer.progress.epoch  # the epoch just finished, 1-based
        if epoch < self.begin_epoch or self.averaged is None:
            return
        self.averaged.update(trainer.unwrapped_model)
        for sched in self.schedulers.values():
            sched.step()
        if epoch >= self._max_epochs:
            self.apply(trainer)

    def after_train(self, trainer: TrainerView) -> None:
        """A run stopped early, after averaging began: apply the average now."""
        if self.averaged is not None and not self.applied and self.averaged.n_averaged > 0:
            self.apply(trainer)

    def apply(self, trainer: TrainerView) -> None:
        """Copy the average into the model and recompute its BatchNorm statistics over the training data."""
        assert self.averaged is not None
        model = trainer.unwrapped_model
        loop = require_train_loop(trainer, "SWAHook.apply")
        batches = getattr(
            loop.dataloader, "loader", loop.dataloader
        )  # the torch DataLoader: the run's data order is left alone
        self.averaged.copy_to(model)
        update_bn(batches, model, forward_for_stats)
        self.applied = True
        trainer.logger.info(
            f"SWAHook: the model now holds the average of {self.averaged.n_averaged} epochs' weights, BatchNorm "
            "statistics recomputed"
        )

    def state_dict(self) -> dict[str, Any]:
        """The average's state (its parameters and ``n_averaged``), each SWALR's state, whether it was applied."""
        if self.averaged is None:
            return dict(self._pending) if self._pending is not None else {}
        return {
            "averaged": self.averaged.state_dict(),
            "schedulers": {name: s.state_dict() for name, s in self.schedulers.items()},
            "applied": self.applied,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state when training starts (the average is built from the resumed model
        then)."""
        if state_dict:
            self._pending = state_dict
            self.averaged = None
            self.schedulers = {}

    def _build_schedulers(self, trainer: TrainerView) -> None:
        for name, ow in optim_wrappers_of(trainer.optim_wrapper).items():
            self.schedulers[name] = SWALR(
                ow.optimizer,
                self.swa_lr,  # type: ignore[arg-type]
                anneal_epochs=self.anneal_epochs,
                anneal_strategy=self.anneal_strategy,  # type: ignore[arg-type]
            )

    def _warn_schedulers(self, trainer: TrainerView, epoch_len: int) -> None:
        """A parameter scheduler still moving the lr after averaging begins fights SWALR: say which."""
        scheds = trainer.param_schedulers
        flat = [s for group in scheds.values() for s in group] if isinstance(scheds, Mapping) else list(scheds or [])
        begin_iter = (self.begin_epoch - 1) * epoch_len
        late = []
        for s in flat:
            end = getattr(s, "end", None)
            if end is None or getattr(s, "param_name", "lr") != "lr":
                continue
            end_iter = end * epoch_len if getattr(s, "by_epoch", False) else end
            if end_iter > begin_iter:
                late.append(type(s).__name__)
        if late:
            trainer.logger.warning(
                f"SWAHook begins averaging in epoch {self.begin_epoch}, but the learning-rate schedulers {late} run "
                "past its start and would "
                f"fight SWALR: end them at epoch {self.begin_epoch - 1} (param_scheduler end=...) or begin SWA later"
            )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(begin_epoch={self.begin_epoch}, swa_lr={self.swa_lr}, "
            f"anneal_epochs={self.anneal_epochs}, anneal_strategy={self.anneal_strategy!r})"
        )
