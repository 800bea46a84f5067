"""The start-of-run check that every process trains the same run: one collective at ``train()`` start.

Each rank describes its run (:func:`describe_rank`: its settings, the train loader's shape, the
checkpoint it resumed from); one ``all_gather_object`` brings every description to every rank;
if they differ, every rank raises :class:`RanksDisagreeError` naming the keys and the ranks.
Settings that may differ per rank are left out (see docs/reliability.md). One process: nothing is compared.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trainwright.data.stream_state import batches_per_pass

if TYPE_CHECKING:
    from trainwright.strategies.base import Strategy

__all__ = ["RanksDisagreeError", "check_ranks_agree", "describe_rank", "disagreements"]

#: Settings that may differ per rank (paths of node-local disks, the run's name, the seed that rank 0's replaces, hooks
#: a
#: script adds on some ranks only, e.g. a profiler on rank 0).
_PER_RANK = frozenset({"work_dir", "experiment_name", "seed", "randomness.seed", "resume", "custom_hooks"})
#: Keys, wherever they sit, that say when a rank writes, not what it computes (a logger's ``flush_secs``).
_PER_RANK_LEAVES = frozenset({"flush_secs"})
_MAX_LISTED = 12


class RanksDisagreeError(RuntimeError):
    """The processes of one run were given different settings, data or checkpoints (raised on every rank at the same
    point)."""

    #: Raised on every rank at the same point: the ranks can still meet in collectives (``Trainer.close`` waits for
    #: them).
    raised_on_every_rank = True


def _flatten(value: Any, prefix: str, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(v, f"{prefix}{k}.", out)
        return
    key = prefix[:-1]
    if key in _PER_RANK or key.rsplit(".", 1)[-1] in _PER_RANK_LEAVES:
        return
    text = repr(value)
    if " at 0x" not in text:  # an object shown by its address differs on every process; it is not compared
        out[key] = text


def describe_rank(config: Mapping[str, Any], train_loader: Any, restored: tuple[Any, int] | None) -> dict[str, Any]:
    """What this rank trains: its settings (flat, key -> repr) and their hash, the loader's shape, the checkpoint it
    resumed from.

    The settings are ``config`` (the trainer's) flattened, without those that may differ per rank: the
    work dir and the run's name (rank 0 names the run), the seed (always rank 0's, broadcast at
    start-up), ``resume``, ``custom_hooks`` (a script may add a hook on some ranks only), when a
    rank writes (``flush_secs``) and objects shown only by their address. The loader's shape is
    its batches per epoch and batch size; the checkpoint comes with the iteration it resumed at.
    """
    settings: dict[str, str] = {}
    _flatten(config, "", settings)
    loader = train_loader
    return {
        "hash": hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest(),
        "settings": settings,
        "batches per epoch": batches_per_pass(loader) if loader is not None else None,
        "batch_size": getattr(loader, "batch_size", None),
        "resumed": None if restored is None else (str(restored[0]), restored[1]),
    }


def _by_rank(values: Sequence[Any], show: Any = repr) -> str:
    return ", ".join(f"rank {r} {show(v)}" for r, v in enumerate(values))


def disagreements(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """What differs between the ranks' descriptions (:func:`describe_rank`), one phrase each; empty when they agree."""
    out: list[str] = []
    resumed = [d["resumed"] for d in ranks]
    if (
        len({None if r is None else (r[0].rsplit("/", 1)[-1], r[1]) for r in resumed}) > 1
    ):  # the same file name and iteration (work dirs may differ)
        out.append(
            "; ".join(
                f"rank {i} resumed from nothing" if r is None else f"rank {i} from {r[0]} (iteration {r[1]})"
                for i, r in enumerate(resumed)
            )
        )
    for key in ("batches per epoch", "batch_size"):
        values = [d[key] for d in ranks]
        if len(set(values)) > 1:
            out.append(f"train_dataloader {key} differs: {_by_rank(values, str)}")
    if len({d["hash"] for d in ranks}) > 1:
        keys = sorted(set().union(*(d["settings"] for d in ranks)))
        differ = [k for k in keys if len({d["settings"].get(k, "<not set>") for d in ranks}) > 1]
        for k in differ[:_MAX_LISTED]:
            out.append(f"{k} differs: {_by_rank([d['settings'].get(k, '<not set>') for d in ranks], str)}")
        if len(differ) > _MAX_LISTED:
            out.append(f"and {len(differ) - _MAX_LISTED} more settings ({', '.join(differ[_MAX_LISTED:])})")
    return out


def check_ranks_agree(
    strategy: Strategy, config: Mapping[str, Any], train_loader: Any, restored: tuple[Any, int] | None
) -> None:
    """Compare every rank's run at ``train()`` start (one ``all_gather_object``); one process: nothing to do.

    ``restored`` is the checkpoint this rank resumed from and its iteration (None: none).

    Raises:
        RanksDisagreeError: on every rank, naming what differs and on which ranks.
    """
    if strategy.world_size == 1:
        return
    found = disagreements(strategy.gather_object(describe_rank(config, train_loader, restored)))
    if found:
        raise RanksDisagreeError(
            "The processes of this run do not train the same run (compared at train() start): "
            + "; ".join(found)
            + ". Every rank must be "
            "given the same settings and data, and see the same checkpoints to resume from (one shared work_dir, or a "
            "copy of it on every "
            "node); nothing was trained."
        )
