"""What a tuner needs of a trainer, and putting the trainer back exactly as it was after the tuner's steps.

:func:`preserved` captures every checkpoint piece in memory
(:meth:`~trainwright.checkpoint.manager.CheckpointManager.capture`) and restores it afterwards,
with what a checkpoint does not hold but the tuner's steps change (gradients, buffers, the
``training`` flags, the optim wrappers' counters).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from trainwright.optim.optim_wrapper_dict import optim_wrappers_of

#: The name :meth:`CheckpointManager.restore` reports for an in-memory capture.
MEMORY = Path("<memory>")


class Checkpoints(Protocol):
    """The trainer's :class:`~trainwright.checkpoint.manager.CheckpointManager` (capture / restore)."""

    def capture(self) -> dict[str, Any]: ...  # noqa: D102
    def restore(self, ckpt: Any, path: Path) -> None: ...  # noqa: D102


class TunableTrainer(Protocol):
    """What the tuners use of a :class:`~trainwright.Trainer` whose train parts are built and whose model is
    prepared."""

    model: nn.Module
    optim_wrapper: Any
    train_loop: Any
    strategy: Any
    logger: logging.Logger

    @property
    def checkpoints(self) -> Checkpoints: ...  # noqa: D102


def _stream_read_here(trainer: TunableTrainer) -> Any | None:
    """The train stream when this process reads it (no loader workers) and it keeps its position in itself
    (``state_dict()``, e.g. a :class:`~trainwright.data.Mixture`); None otherwise (workers read copies of it)."""
    loader = getattr(trainer.train_loop, "dataloader", None)
    if loader is None or not getattr(loader, "stateful", False) or loader.loader.num_workers:
        return None
    dataset = loader.dataset
    return dataset if callable(getattr(dataset, "state_dict", None)) else None


def _runtime_state(trainer: TunableTrainer) -> dict[str, Any]:
    """What the steps change outside the checkpoint pieces (listed in :func:`preserved`)."""
    model = trainer.model
    params = list(model.parameters())
    stream = _stream_read_here(trainer)
    return {
        # at the start of a pass the checkpoint holds no stream position ("from the start"), but a stream read in
        # this process has moved on by the tuner's batches
        "stream": None if stream is None else (stream, copy.deepcopy(stream.state_dict())),
        "grads": [None if p.grad is None else p.grad.detach().clone() for p in params],
        "buffers": [b.detach().clone() for b in model.buffers()],
        "training": [m.training for m in model.modules()],
        "wrappers": {
            name: (ow.inner_count, ow.max_counts, ow.grad_norm, ow.skipped_steps)
            for name, ow in optim_wrappers_of(trainer.optim_wrapper).items()
        },
    }


def _put_back(trainer: TunableTrainer, state: dict[str, Any]) -> None:
    model = trainer.model
    with torch.no_grad():
        for p, g in zip(model.parameters(), state["grads"]):
            p.grad = None if g is None else g.clone()
        for b, saved in zip(model.buffers(), state["buffers"]):
            b.copy_(saved)
    for m, flag in zip(model.modules(), state["training"]):
        m.training = flag
    if state["stream"] is not None:
        stream, position = state["stream"]
        stream.load_state_dict(position)
    for name, ow in optim_wrappers_of(trainer.optim_wrapper).items():
        inner, span, grad_norm, skipped = state["wrappers"][name]
        ow.initialize_count_status(None, inner, span)
        ow.grad_norm, ow.skipped_steps = grad_norm, skipped
        ow.release_graph()  # the tuner's last graph (kept by backward for the next forward), not the run's: freed


@contextlib.contextmanager
def preserved(trainer: TunableTrainer) -> Iterator[None]:
    """Run the block, then put the trainer back bitwise: model, optimizer, schedulers, data position, RNG, hooks'
    states, gradients.

    Besides every checkpoint piece it puts back what a checkpoint does not hold but the
    tuner's steps change: every parameter's ``.grad`` (also of parameters outside the
    optimizer, which ``zero_grad`` never clears), every buffer (non-persistent ones are not in
    a state dict), each module's ``training`` flag, the optim wrappers' counters (window
    position, ``grad_norm``, ``skipped_steps``) and the position of a train stream this process reads itself (no
    loader workers) that keeps it in its ``state_dict()``, such as a :class:`~trainwright.data.Mixture`. While the
    block runs, the wrappers' spike guards (``Trainer(spike_guard=...)``) are detached: the tuner's steps take the plain
    update path.

    The restore runs also when the block raises (an out-of-memory error of the batch-size
    finder, a ``KeyboardInterrupt``). Under several processes the capture and the restore are
    collectives, as a checkpoint save is: call the tuner on every process.
    """
    runtime = _runtime_state(trainer)
    captured = trainer.checkpoints.capture()
    wrappers = optim_wrappers_of(trainer.optim_wrapper).values()
    guards = [(ow, ow.spike_guard) for ow in wrappers if getattr(ow, "spike_guard", None) is not None]
    try:
        for ow, _ in guards:
            # the plain update path: an lr ramp makes loss spikes on purpose, none may be skipped or rolled back
            ow.spike_guard = None
        yield
    finally:
        for ow, guard in guards:
            ow.spike_guard = guard
        for ow in wrappers:
            ow.zero_grad(
                set_to_none=True
            )  # the tuner's gradients go before the state comes back (less memory at the peak)
        trainer.checkpoints.restore(captured, MEMORY)
        _put_back(trainer, runtime)
