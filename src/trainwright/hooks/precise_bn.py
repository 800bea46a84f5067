"""PreciseBNHook (detectron2's ``PreciseBN``): BatchNorm statistics recomputed as true averages before evaluation.

The batches come from a loader of the hook's own over the training set; every random stream is
put back afterwards, so training goes on exactly as without the hook.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler
from typing_extensions import override

from trainwright.checkpoint.rng import get_rng_state, set_rng_state
from trainwright.data.loader import batch_seed
from trainwright.hooks.bn_stats import forward_for_stats, update_bn
from trainwright.hooks.hook import Hook
from trainwright.hooks.sync_buffers import average_buffers
from trainwright.hooks.view import require_train_loop
from trainwright.registry import HOOKS

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView


@HOOKS.register_module()
class PreciseBNHook(Hook):
    """Replace every BatchNorm layer's running mean and variance by their average over ``num_iter`` training batches.

    The running statistics are an exponential average of batches seen under weights that kept
    changing, so they lag the weights being evaluated (detectron2's ``PreciseBN``; Wu & Johnson,
    "Rethinking 'Batch' in BatchNorm"). This hook recomputes them at the current weights with
    torch's ``update_bn`` rule (statistics reset, momentum None: a plain average), every
    ``interval`` epochs (``by_epoch``) or iterations and at the end of training, before the
    validation and checkpoint of that point.

    The batches: the training set through a loader of the hook's own (the train loader's batch
    size and collate function, no workers, ``drop_last``), in a random order drawn from a
    generator seeded by the run's seed, the iteration and the rank; the training loader is not
    touched. Python's, NumPy's and torch's global generators are restored afterwards, so a run
    with the hook trains the same batches as one without, and resumes bitwise. Under several
    processes each averages over its own batches, then the statistics are averaged over the
    processes (one all-reduce).

    Args:
        num_iter: Batches to average over (detectron2's default: 200); fewer when the training
            set holds fewer (each sample is used once).
        interval: Every ``interval`` epochs (``by_epoch``) or iterations; None: at the end of
            training only.
        by_epoch: Count ``interval`` in epochs (the default) or in iterations.
    """

    priority = "ABOVE_NORMAL"

    def __init__(self, num_iter: int = 200, interval: int | None = None, by_epoch: bool = True) -> None:
        if isinstance(num_iter, bool) or not isinstance(num_iter, int) or num_iter < 1:
            raise ValueError(
                f"PreciseBNHook num_iter must be an int >= 1 (batches to average the statistics over), got {num_iter!r}"
            )
        if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 1):
            raise ValueError(
                "PreciseBNHook interval must be an int >= 1, or None to recompute at the end of training only, got "
                f"{interval!r}"
            )
        self.num_iter = num_iter
        self.interval = interval
        self.by_epoch = by_epoch
        self._last = (0, 0)  # the last (max_epochs, max_iters) of this train()

    @override
    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        loop = require_train_loop(trainer, "PreciseBNHook.before_train")
        loader = getattr(loop.dataloader, "loader", loop.dataloader)
        if isinstance(getattr(loader, "dataset", None), IterableDataset):
            raise ValueError(
                "PreciseBNHook draws random batches from the training set, which needs a map-style dataset (an "
                "IterableDataset has no indices)"
            )
        if self.by_epoch and not loop.by_epoch:
            raise ValueError(
                "PreciseBNHook counts its interval in epochs (by_epoch=True) but training is iteration-based: "
                "use custom_hooks=[dict(type='PreciseBNHook', by_epoch=False, interval=N)]"
            )
        self._last = (int(getattr(loop, "max_epochs", 0) or 0), loop.max_iters)

    @override
    def train_iter_interval(self, trainer: TrainerView) -> int | range:  # noqa: D102
        if self.by_epoch:
            return 0
        last = self._last[1]
        return self.interval if self.interval is not None else range(last, last + 1)

    @override
    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:  # noqa: D102
        it = trainer.progress.iteration
        if it == self._last[1] or (self.interval is not None and it % self.interval == 0):
            self.recompute(trainer)

    @override
    def after_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        if not self.by_epoch:
            return
        epoch = trainer.progress.epoch
        if epoch == self._last[0] or (self.interval is not None and epoch % self.interval == 0):
            self.recompute(trainer)

    def recompute(self, trainer: TrainerView) -> None:
        """Recompute the statistics now over ``num_iter`` fresh training batches; the random streams are left as they
        were."""
        loop = require_train_loop(trainer, "PreciseBNHook.recompute")
        loader = getattr(loop.dataloader, "loader", loop.dataloader)
        batch_size = getattr(loop.dataloader, "batch_size", None) or loader.batch_size or 1
        dataset = loader.dataset
        seed = trainer.message_hub.get_info("seed") or 0
        generator = torch.Generator().manual_seed(
            batch_seed(int(seed), trainer.progress.iteration, trainer.strategy.rank)
        )
        own = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=RandomSampler(dataset, generator=generator),
            collate_fn=loader.collate_fn,
            drop_last=len(dataset) >= batch_size,
        )
        rng = get_rng_state()
        try:
            batches: Iterator[Any] = itertools.islice(iter(own), self.num_iter)
            update_bn(batches, trainer.unwrapped_model, forward_for_stats)
        finally:
            set_rng_state(rng)
        average_buffers(trainer)

    def __repr__(self) -> str:
        return f"PreciseBNHook(num_iter={self.num_iter}, interval={self.interval}, by_epoch={self.by_epoch})"
