"""The batch-size finder (Lightning's ``Tuner.scale_batch_size``): the largest batch a few training steps fit in device
memory.

:func:`find_batch_size` doubles the batch size (``mode="power"``), running ``steps_per_trial``
training steps at each size through the run's update path, until the device reports
out-of-memory (``torch.cuda.OutOfMemoryError``); ``mode="binsearch"`` then narrows between the
last size that fit and the first that did not. The trainer is put back bitwise afterwards
(:func:`~trainwright.tuning.state.preserved`). Only a device that raises out-of-memory (CUDA)
can be probed: on the CPU the process would swap or be killed instead. See docs/diagnose.md.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

from trainwright.data.stream_state import has_state, stateful_loader_class
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.tuning.state import TunableTrainer, preserved

#: Accepted ``mode`` values.
MODES = ("power", "binsearch")


def check_batch_size_args(
    device: torch.device, world_size: int, mode: str, init: int, max_trials: int, steps_per_trial: int
) -> None:
    """Check :func:`find_batch_size`'s arguments and the device before anything is built.

    Raises:
        RuntimeError: the device is not CUDA, or several processes run.
        ValueError: an argument out of range.
    """
    if device.type != "cuda":
        raise RuntimeError(
            f"find_batch_size needs a device that reports out-of-memory (CUDA): this trainer runs on {device.type!r}, "
            "where running out of "
            "memory swaps or kills the process instead of raising an error to stop at. Run it on a CUDA machine, or "
            "choose the batch size "
            "by hand (train_dataloader batch_size)."
        )
    if world_size > 1:
        raise RuntimeError(
            f"find_batch_size runs in one process (this run has {world_size}): an out-of-memory error on one process "
            "would leave the others "
            "waiting in a collective. Run it with one process; the size it finds is the batch size per process."
        )
    if mode not in MODES:
        raise ValueError(
            "find_batch_size mode must be 'power' (double until out of memory) or 'binsearch' (then narrow down), got "
            f"{mode!r}"
        )
    for name, value in (("init", init), ("max_trials", max_trials), ("steps_per_trial", steps_per_trial)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"find_batch_size {name} must be an int >= 1, got {value!r}")


def _trial_loader(train_loader: Any, batch_size: int) -> DataLoader:
    """A loader of the train dataset's first samples in batches of ``batch_size`` (the train loader's collate; no
    workers)."""
    return DataLoader(
        train_loader.dataset,
        batch_size=batch_size,
        shuffle=False,
        collate_fn=train_loader.loader.collate_fn,
        num_workers=0,
    )


def with_batch_size(cfg: Any, batch_size: int) -> Any:
    """``cfg`` (a ``train_dataloader`` dict or ``DataLoader``) with another ``batch_size``; the rest as it was (a
    stream's loader too; torchdata's ``StatefulDataLoader`` stays one).

    Raises:
        ValueError: the loader has its own ``batch_sampler`` (its batches are not sized by ``batch_size``).
    """
    if isinstance(cfg, Mapping):
        if cfg.get("batch_sampler") is not None:
            raise ValueError(
                "find_batch_size(apply=True): the train_dataloader has its own batch_sampler; set its batch size there"
            )
        return {**cfg, "batch_size": batch_size}
    if not isinstance(cfg, DataLoader):
        raise ValueError(
            "find_batch_size(apply=True) needs the train_dataloader as a DataLoader or a dict, got "
            f"{type(cfg).__name__}"
        )
    if cfg.batch_size is None:
        raise ValueError(
            "find_batch_size(apply=True): the train_dataloader has its own batch_sampler; set its batch size there"
        )
    sampler = cfg.sampler
    standard = type(sampler) in (RandomSampler, SequentialSampler) and not getattr(sampler, "replacement", False)
    kwargs: dict[str, Any] = dict(
        batch_size=batch_size,
        drop_last=cfg.drop_last,
        num_workers=cfg.num_workers,
        collate_fn=cfg.collate_fn,
        pin_memory=cfg.pin_memory,
        timeout=cfg.timeout,
        worker_init_fn=cfg.worker_init_fn,
        multiprocessing_context=cfg.multiprocessing_context,
        generator=cfg.generator,
        persistent_workers=cfg.persistent_workers,
        pin_memory_device=cfg.pin_memory_device,
    )
    if cfg.num_workers > 0:
        kwargs["prefetch_factor"] = cfg.prefetch_factor
    if isinstance(cfg.dataset, IterableDataset):
        pass  # a stream orders itself: its loader takes no sampler and no shuffle
    elif standard:
        kwargs["shuffle"] = isinstance(sampler, RandomSampler)
    else:
        kwargs["sampler"] = sampler
    # torchdata's StatefulDataLoader (a stream's position in checkpoints) stays one; any other subclass: a DataLoader
    stateful = stateful_loader_class() if has_state(cfg) else None
    loader_class = stateful if stateful is not None and isinstance(cfg, stateful) else DataLoader
    return loader_class(cfg.dataset, **kwargs)


def _fits(trainer: TunableTrainer, batch_size: int, steps: int) -> bool:
    """Whether ``steps`` training steps at ``batch_size`` run without the device running out of memory."""
    model, ow = trainer.model, trainer.optim_wrapper
    train_step: Any = model.train_step
    loader = _trial_loader(trainer.train_loop.dataloader, batch_size)
    wrappers = optim_wrappers_of(ow)
    for w in wrappers.values():
        w.initialize_count_status(model, 0, steps * w.accumulative_counts)
    acc = max(w.accumulative_counts for w in wrappers.values())
    torch.cuda.empty_cache()  # what the last trial left cached (an out-of-memory one included) goes back first
    try:
        done = 0
        while done < steps * acc:
            for batch in loader:
                train_step(batch, ow)
                done += 1
                if done == steps * acc:
                    break
        torch.cuda.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        for w in wrappers.values():
            w.zero_grad(set_to_none=True)
            w.release_graph()  # the trial's graph
        torch.cuda.empty_cache()


def find_batch_size(
    trainer: TunableTrainer, mode: str = "power", init: int = 2, max_trials: int = 25, steps_per_trial: int = 3
) -> int:
    """The largest batch size (per process) for which ``steps_per_trial`` training steps fit in device memory; the
    trainer is put back after.

    Sizes tried: ``init``, ``2 * init``, ``4 * init``... (``max_trials`` at most, and not beyond
    the dataset's length: a batch cannot be larger). ``"binsearch"`` then bisects between the
    last size that fit and the first that did not (within the same ``max_trials``).

    Raises:
        RuntimeError: ``init`` itself does not fit.
    """
    dataset = trainer.train_loop.dataloader.dataset
    n_samples = len(dataset) if isinstance(dataset, Sized) else sys.maxsize  # a stream without a length: no cap
    tried: list[tuple[int, bool]] = []
    with preserved(trainer):
        model = trainer.model
        model.train()
        good, bad = 0, None
        size = min(init, n_samples)
        while len(tried) < max_trials:
            ok = _fits(trainer, size, steps_per_trial)
            tried.append((size, ok))
            if not ok:
                bad = size
                break
            good = size
            if size >= n_samples:
                break
            size = min(size * 2, n_samples)
        if mode == "binsearch" and bad is not None:
            while len(tried) < max_trials and bad - good > 1 and good > 0:
                size = (good + bad) // 2
                ok = _fits(trainer, size, steps_per_trial)
                tried.append((size, ok))
                good, bad = (size, bad) if ok else (good, size)
    trainer.logger.info(
        "Batch-size finder: "
        + ", ".join(f"{s} {'fits' if ok else 'out of memory'}" for s, ok in tried)
        + (f"; largest that fits: {good}" if good else "")
    )
    if not good:
        raise RuntimeError(
            f"find_batch_size: the first batch size tried, {tried[0][0]}, does not fit in device memory "
            f"({steps_per_trial} training steps ran out of memory); "
            "use a smaller model, precision='bf16-mixed', activation_checkpointing, or gradient accumulation with a "
            "smaller batch"
        )
    return good
