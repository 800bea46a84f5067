"""Where a NaN / Inf loss came from: replay the iteration with a watch on every module's output and every parameter's
gradient.

:func:`explain_nonfinite` (called by the run's guard when the metric store raised a
``NonFiniteLossError``, nothing before) names the batch and replays it: on the current weights if they are finite, else
from the newest checkpoint
before it on one process. A :class:`Watch` records the first non-finite module output and
parameter gradient. The cases and what they cost: docs/diagnose.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch
from torch import nn

from trainwright.checkpoint.storage import Location
from trainwright.hooks.dispatch import HookList
from trainwright.hooks.hook import Hook
from trainwright.hooks.view import TrainerView, TrainLoopView
from trainwright.logging.metric_store import MetricStore
from trainwright.loops.context import LoopContext

if TYPE_CHECKING:
    from trainwright.data.loader import ResumableLoader

__all__ = ["DiagnosedRun", "Finding", "ReplayLoop", "Watch", "explain_nonfinite"]


class ReplayLoop(TrainLoopView, Protocol):
    """What the diagnosis uses of the train loop: its loader, and running it on a context of its own (the replay)."""

    ctx: LoopContext | None

    def run(self, ctx: LoopContext) -> None:
        """Run the remaining iterations from ``ctx.progress`` with ``ctx``'s hooks."""


class DiagnosedRun(TrainerView, Protocol):
    """What :func:`explain_nonfinite` reads of a run, beyond what hooks see (the Trainer satisfies it; this layer sits
    below it).

    The replay restores a checkpoint through ``checkpoints``, drives ``train_loop`` with the
    hooks that change training (from ``hooks``) on ``model``, and puts the run back.
    """

    @property
    def model(self) -> nn.Module:
        """The model the loops call (a distributed wrapper, when the strategy made one)."""

    @property
    def hooks(self) -> HookList:
        """The run's hooks."""

    @property
    def unwrapped_base(self) -> nn.Module:
        """The user's model (the BaseModel) without the strategy's wrapper: its ``data_preprocessor``,
        ``run_forward``, ``parse_losses``."""

    @property
    def train_loop(self) -> ReplayLoop | None:
        """The training loop, or None before ``train()`` built it."""


def _nonfinite(x: Any) -> bool:
    """Whether a tensor (or a tuple / list / dict of them) holds a NaN / Inf (floating tensors only)."""
    if isinstance(x, torch.Tensor):
        return bool(x.is_floating_point() or x.is_complex()) and not bool(torch.isfinite(x.detach()).all())
    if isinstance(x, (list, tuple)):
        return any(_nonfinite(v) for v in x)
    if isinstance(x, dict):
        return any(_nonfinite(v) for v in x.values())
    return False


class Finding(NamedTuple):
    """What a watched iteration showed (None: nothing of that kind was non-finite)."""

    iteration: int
    module: str | None  # the first module (path) whose forward output was non-finite
    module_type: str | None
    inputs_finite: bool  # whether that module's inputs were all finite
    parameter: str | None  # the first parameter (backward order) whose gradient was non-finite
    loss_finite: bool
    batch_finite: bool

    @property
    def found(self) -> bool:
        """Whether anything was non-finite."""
        return self.module is not None or self.parameter is not None or not self.loss_finite or not self.batch_finite

    def describe(self) -> str:
        """The finding in words."""
        parts: list[str] = []
        if not self.batch_finite:
            parts.append("the batch itself holds NaN / Inf values")
        if self.module is not None:
            where = (
                "the model's own forward (after its submodules)"
                if self.module == ""
                else f"module '{self.module}' ({self.module_type})"
            )
            parts.append(
                f"the first module whose forward output was non-finite is {where}"
                + ("; its inputs were finite" if self.inputs_finite else "; its inputs were non-finite already")
            )
        elif self.parameter is not None:  # (after a non-finite output, non-finite gradients follow from it)
            parts.append(f"the first non-finite gradient of the backward pass is that of parameter '{self.parameter}'")
        if not parts:
            parts.append(
                "the forward outputs and the gradients were finite" + ("" if self.loss_finite else ", the loss was not")
            )
        return "; ".join(parts)


class Watch:
    """Forward hooks on every module and gradient hooks on every parameter of ``model``, recording the first non-finite
    value.

    It records the first module (in execution order, by module path) whose forward output held
    a NaN / Inf, whether its inputs were finite, and the first parameter (in backward order)
    whose gradient did.

    Used as a context manager around forward and backward passes; the hooks are removed on
    exit. Each hook reads its tensor on the host (a sync per module and parameter): a
    diagnosis tool, not for training.

    Args:
        model: The model as the user named it (module paths are its ``named_modules()``).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.module: tuple[str, str, bool] | None = None  # (path, class name, inputs finite)
        self.parameter: str | None = None
        self._handles: list[Any] = []

    def reset(self) -> None:
        """Forget what was recorded (the next iteration)."""
        self.module = None
        self.parameter = None

    def __enter__(self) -> Watch:
        for name, module in self.model.named_modules():
            self._handles.append(module.register_forward_hook(self._forward_hook(name)))
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                self._handles.append(p.register_hook(self._grad_hook(name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _forward_hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.module is None and _nonfinite(output):
                self.module = (name, type(module).__name__, not _nonfinite(args))

        return hook

    def _grad_hook(self, name: str) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if self.parameter is None and _nonfinite(grad):
                self.parameter = name

        return hook

    def finding(self, iteration: int, loss_finite: bool, batch_finite: bool) -> Finding:
        """What was recorded, as a :class:`Finding` of ``iteration``."""
        m = self.module
        return Finding(
            iteration,
            m[0] if m else None,
            m[1] if m else None,
            m[2] if m else True,
            self.parameter,
            loss_finite,
            batch_finite,
        )


# -- the batch of an iteration ---------------------------------------------------------------------
def _position(loader: ResumableLoader, iteration: int) -> tuple[int, int]:
    """(epoch, batch index in the epoch) of ``iteration`` (1-based): the loader has a fixed length per epoch."""
    return divmod(iteration - 1, len(loader))


def batch_indices(loader: ResumableLoader, epoch: int, index: int) -> list[int] | None:
    """The dataset indices of batch ``index`` of ``epoch``'s data order (this process's shard); None: the sampler
    cannot say."""
    bs = loader.loader.batch_sampler
    inner = getattr(bs, "batch_sampler", bs)
    sampler = getattr(inner, "sampler", None)
    if inner is None or sampler is None or not hasattr(sampler, "set_epoch"):
        return None
    old = getattr(sampler, "epoch", None)
    sampler.set_epoch(epoch)
    try:
        found = next(itertools.islice(iter(inner), index, None), None)
    finally:
        if old is not None:
            sampler.set_epoch(old)
    return None if found is None else [int(i) for i in found]


def _fetch(loader: ResumableLoader, epoch: int, index: int) -> Any:
    """Batch ``index`` of ``epoch`` through the loader's own pipeline (the loader's position is put back)."""
    saved = loader.epoch, loader.position
    loader.epoch, loader.position = epoch, index
    try:
        it: Iterator[Any] = iter(loader)
        return next(it)
    finally:
        loader.epoch, loader.position = saved


def _where(loader: ResumableLoader, iteration: int) -> str:
    if loader.length is None:  # a stream without a length (endless, a Mixture): no batch index per epoch
        return f"the stream's batch of iteration {iteration} (a stream without a length names its batches by iteration)"
    epoch, index = _position(loader, iteration)
    indices = batch_indices(loader, epoch, index)
    shown = "" if indices is None else f", dataset indices {indices if len(indices) <= 16 else [*indices[:16], '...']}"
    return (
        f"batch {index} of epoch {epoch + 1}'s data order (0-based batch index{shown}; "
        "trainer.train_loop.dataloader.dataset[i] shows a sample)"
    )


# -- the diagnosis ---------------------------------------------------------------------------------
def explain_nonfinite(trainer: DiagnosedRun, iteration: int) -> str:
    """Where the non-finite loss of ``iteration`` came from, as a sentence for the error (never raises).

    Called by the metric store when it raises its ``FloatingPointError`` (``nonfinite_loss="raise"``),
    which finds a non-finite loss at a flush, up to ``agreement.every`` iterations after it
    happened. Names the batch (its index in the epoch's data order and its dataset indices) and
    replays:

    * the weights are still finite (the NaN is of the current iteration, or a GradScaler skipped
      its step): batch k once more on them, forward and ``torch.autograd.grad`` (no ``.grad`` is
      touched, no collective: DDP's module is called directly);
    * they are not, on one process: the newest checkpoint saved before iteration k is restored and
      the run replayed from there through the train loop itself (bitwise, as a resume), watched
      at every iteration until the first non-finite value; the trainer is put back afterwards;
    * otherwise (several processes, a sharded strategy, no checkpoint before k): what the current
      weights show (which parameters are non-finite), and how to get the module named.
    """
    try:
        return _explain(trainer, iteration)
    except Exception as e:  # a diagnosis never hides the error it explains
        return f" (Finding where it came from failed: {type(e).__name__}: {e})"


def _explain(trainer: DiagnosedRun, k: int) -> str:
    loop = trainer.train_loop
    if loop is None:
        return ""
    loader = loop.dataloader
    strategy = trainer.strategy
    head = f" Iteration {k} trained on {_where(loader, k)}."
    several = strategy.world_size > 1
    if several and not strategy.forward_is_local:
        return head + (
            f" No replay under the {strategy.name} strategy with several processes (a forward of its sharded model is "
            "a collective); "
            "resume from the last checkpoint on one process to have the module named."
        )
    model = trainer.unwrapped_model
    bad = [n for n, p in model.named_parameters() if _nonfinite(p)]
    stream = loader.length is None  # its batch k is read again only by replaying from a checkpoint (as a resume)
    if not bad and not stream:
        finding = _probe(trainer, _fetch(loader, *_position(loader, k)), k)
        why = "the update after it was not taken: inside an accumulation window, or skipped by the float16 GradScaler"
        whose = "this process's own batch" if several else "the batch"
        others = (
            " With several processes the non-finite loss may have been another process's, whose log names its batch."
            if several
            else ""
        )
        return head + f" Replayed {whose} on the current weights (still finite: {why}): {finding.describe()}.{others}"
    shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
    weights = (
        f"non-finite already ({shown})"
        if bad
        else "still finite, but a stream's batch is read again only from a checkpoint"
    )
    if several:
        return head + (
            f" The weights are {weights}; a replay from a checkpoint runs on one process only: "
            "resume from the last checkpoint saved before it on one process (as a DDP run trains on one) to have the "
            "module named."
        )
    source = _checkpoint_before(trainer, k)
    if source is None:
        return head + (
            f" No state from before iteration {k} to replay from (no checkpoint saved before it in "
            f"{trainer.checkpoints.ckpt_dir}); the current "
            + (
                f"weights are non-finite in {shown}."
                if bad
                else "weights are finite (a stream's batch is read again only by a replay from a checkpoint)."
            )
            + " Save checkpoints more often (CheckpointHook interval) to have the module named."
        )
    return head + _replay(trainer, *source, k)


def _probe(trainer: DiagnosedRun, batch: Any, k: int) -> Finding:
    """Batch ``batch`` forward and backward on the current weights under a :class:`Watch` (``torch.autograd.grad``:
    no ``.grad`` changes, no collective)."""
    base: Any = (
        trainer.unwrapped_base
    )  # the BaseModel, not its DDP wrapper (its run_forward / parse_losses are BaseModel's)
    params = [p for p in base.parameters() if p.requires_grad]
    with Watch(trainer.unwrapped_model) as watch:
        data = base.data_preprocessor(batch, True)
        with trainer.strategy.precision.autocast():
            losses = base.run_forward(data, "loss")  # the model's own forward dispatch
        loss, _ = base.parse_losses(losses)
        loss_finite = not _nonfinite(loss)
        if params and loss.requires_grad:
            torch.autograd.grad(loss, params, allow_unused=True)
    return watch.finding(k, loss_finite, not _nonfinite(data))


class _Found(Exception):
    """Ends the replay at the first watched iteration that showed something (or at the iteration of the NaN loss)."""

    def __init__(self, finding: Finding) -> None:
        super().__init__()
        self.finding = finding


class _ReplayWatch(Hook):
    """Watches every replayed iteration; raises :class:`_Found` at the first non-finite value or at ``last``."""

    priority = "HIGHEST"

    def __init__(self, model: nn.Module, last: int) -> None:
        self.watch = Watch(model)
        self.last = last
        self.batch_finite = True

    def before_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None) -> None:  # noqa: D102
        self.watch.reset()
        self.batch_finite = not _nonfinite(data_batch)
        self.watch.__enter__()

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:  # noqa: D102
        self.watch.__exit__()
        it = trainer.progress.iteration
        finding = self.watch.finding(it, not _nonfinite(outputs), self.batch_finite)
        if finding.found or it >= self.last:
            raise _Found(finding)


def _checkpoint_before(trainer: DiagnosedRun, k: int) -> tuple[Location, dict[str, Any]] | None:
    """The newest checkpoint of the run saved before iteration ``k`` (one that loads), with its contents."""
    from trainwright.checkpoint.listing import list_checkpoints

    for path in list_checkpoints(trainer.checkpoints.ckpt_dir, suffix=trainer.strategy.resumable_suffixes):
        try:
            ckpt = trainer.strategy.load_checkpoint(path)
        except Exception:
            continue
        progress = ckpt.get("progress") if isinstance(ckpt, dict) else None
        if isinstance(progress, dict) and int(progress.get("iteration", k)) < k:
            return path, ckpt
    return None


def _replay(trainer: DiagnosedRun, path: Location, ckpt: dict[str, Any], k: int) -> str:
    """Restore ``ckpt``, train on through the train loop (the hooks that change training only) under a watch; put the
    trainer back."""
    loop = trainer.train_loop
    assert loop is not None
    from trainwright.hooks.param_scheduler import ParamSchedulerHook
    from trainwright.hooks.sampler_seed import DistSamplerSeedHook

    here = trainer.checkpoints.capture()  # the trainer as it is now, put back after the replay
    agreement = trainer.metric_store.agreement
    old_ctx, old_stop = loop.ctx, agreement.finish
    trainer.checkpoints.restore(ckpt, path)
    s = trainer.progress.iteration
    watch = _ReplayWatch(trainer.unwrapped_model, k)
    hooks = HookList([*(h for h in trainer.hooks if isinstance(h, (ParamSchedulerHook, DistSamplerSeedHook))), watch])
    ctx = LoopContext(
        view=trainer,
        model=trainer.model,
        hooks=hooks,
        progress=trainer.progress,
        optim_wrapper=trainer.optim_wrapper,
        metric_store=MetricStore(raise_on_nonfinite=False),
        precision=trainer.strategy.precision,
        logger=trainer.logger,
    )
    trainer.logger.info(
        f"Replaying iterations {s + 1}..{k} from {path} to find where the non-finite loss of iteration {k} came from"
    )
    finding: Finding | None = None
    try:
        agreement.set_finish(False)
        loop.run(ctx)
    except _Found as found:
        finding = found.finding
    finally:
        watch.watch.__exit__()
        loop.ctx = old_ctx
        trainer.checkpoints.restore(here, Path("<memory>"))
        agreement.set_finish(old_stop)
    replayed = f"Replayed iterations {s + 1}..{k} from {path}"
    if finding is None or not finding.found:
        return f" {replayed}: nothing was non-finite (the replay is not bitwise here: nondeterministic ops or data?)."
    j = finding.iteration
    if j < k:
        return (
            f" {replayed}: the first non-finite value appears at iteration {j}, before the loss turned non-finite (on "
            f"{_where(loop.dataloader, j)}): {finding.describe()}."
        )
    return f" {replayed}: {finding.describe()}."
