"""Every rank's unfinished accumulation window in one checkpoint, and each rank's own back on resume.

Inside an accumulation window each rank holds gradients of its own micro-batches (DDP's ``no_sync`` reduces them only
on the window's last one), but a single-file checkpoint is written by rank 0. A save inside a window therefore gathers
every rank's window (``partial_grads``, ``partial_items``, ``skip_window``) into ``window_per_rank`` beside the optim
wrapper's state (one collective, as the ``data_state`` and ``rng`` pieces do), and a resume gives each rank its own.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from trainwright.optim.optim_wrapper_dict import optim_wrappers_of

__all__ = ["WINDOW_KEYS", "gather_windows", "own_window"]

#: The optim wrapper's state entries that describe its unfinished window (present only inside one).
WINDOW_KEYS = ("partial_grads", "partial_items", "skip_window")
#: Where the ranks' windows are kept, in each optim wrapper's state.
PER_RANK = "window_per_rank"


def _on_cpu(value: Any) -> Any:
    """Tensors (also in a list) on the CPU: a gathered CUDA tensor would be unpickled on its sender's device."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, list):
        return [_on_cpu(v) for v in value]
    return value


def _windowed(state: Mapping[str, Any], optim_wrapper: Any) -> list[str]:
    """The names of the optim wrappers whose state holds an unfinished window (``""``: a single wrapper)."""
    return [name for name in optim_wrappers_of(optim_wrapper) if "partial_grads" in (state[name] if name else state)]


def gather_windows(
    state: dict[str, Any], optim_wrapper: Any, gather: Callable[[Any], list[Any]], world_size: int
) -> dict[str, Any]:
    """``state`` (the optim piece's) with every rank's window added as ``window_per_rank`` (in rank order).

    A collective under several processes, called on every rank; only inside a window, which every rank is in at the
    same iterations (the windows are counted alike). Outside one, or on one process, ``state`` is returned as it is.
    """
    names = _windowed(state, optim_wrapper) if world_size > 1 else []
    if not names:
        return state
    own = {
        name: {k: _on_cpu(v) for k, v in (state[name] if name else state).items() if k in WINDOW_KEYS} for name in names
    }
    every = gather(own)
    for name in names:
        sub = dict(state[name]) if name else state
        sub[PER_RANK] = [ranks[name] for ranks in every]
        if name:
            state[name] = sub
    return state


def _mean_window(windows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One window from several ranks': the mean of their gradients (and item counts), so the window's averaged
    gradient keeps what was accumulated."""
    grads = [w["partial_grads"] for w in windows]
    mean = [
        None if all(g[i] is None for g in grads) else torch.stack([g[i] for g in grads if g[i] is not None]).mean(0)
        for i in range(len(grads[0]))
    ]
    out: dict[str, Any] = {"partial_grads": mean}
    items = [w["partial_items"] for w in windows if "partial_items" in w]
    if items:
        out["partial_items"] = torch.stack([torch.as_tensor(i, dtype=torch.float64) for i in items]).mean()
    if any(w.get("skip_window") for w in windows):
        out["skip_window"] = True
    return out


def own_window(state: Mapping[str, Any], optim_wrapper: Any, rank: int, world_size: int) -> Mapping[str, Any]:
    """``state`` with this rank's own window in place of rank 0's (what a resume loads into the optim wrapper).

    A checkpoint saved inside a window by another number of processes (or by one, or by a trainwright that kept only
    rank 0's window) cannot continue the window exactly: each rank gets the mean of the saved windows, with a warning
    naming the fix.
    """
    names = [n for n in _windowed(state, optim_wrapper) if world_size > 1 or PER_RANK in (state[n] if n else state)]
    if not names:
        return state
    out = dict(state)
    for name in names:
        sub = state[name] if name else state
        saved = sub.get(PER_RANK) or [{k: sub[k] for k in WINDOW_KEYS if k in sub}]
        if len(saved) == world_size:
            window = dict(saved[rank])
        else:
            warnings.warn(
                f"The checkpoint was saved inside a gradient accumulation window by {len(saved)} process(es) (or by "
                "a trainwright that kept rank 0's partial gradients only), "
                f"this run has {world_size}: every rank continues the window with the mean of the saved ranks' "
                "partial gradients, so this window's update is not the uninterrupted run's. Resume with "
                f"{len(saved)} process(es), or from a checkpoint saved at a window boundary (a checkpoint interval "
                "that is a multiple of accumulative_counts)",
                stacklevel=3,
            )
            window = _mean_window(saved)
        own = {k: v for k, v in sub.items() if k not in WINDOW_KEYS and k != PER_RANK}
        own.update(window)
        if name:
            out[name] = own
        else:
            out = own
    return out
