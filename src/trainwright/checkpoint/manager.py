"""CheckpointManager: the one owner of a run's checkpoint files, and of restoring them.

It saves named :class:`Stateful` pieces (plus ``rng``, always last) through the strategy, which
owns the format; points ``latest`` at each periodic save, then deletes what fell out of the
keep-k / best-k windows; restores with every piece checked before any loads, RNG last. Hooks
decide *when* to save (:class:`~trainwright.hooks.CheckpointHook`); see docs/checkpoints.md.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from trainwright.checkpoint.durability import when_durable
from trainwright.checkpoint.io import CHECKPOINT_SUFFIX, write_whole
from trainwright.checkpoint.listing import list_checkpoints, read_latest, recording_skips, write_latest
from trainwright.checkpoint.lock import WorkDirBusyError, WorkDirLock
from trainwright.checkpoint.migrate import migrate
from trainwright.checkpoint.retention import (
    CheckpointSpaceError,
    Retention,
    free_bytes,
    preflight,
    tensor_bytes,
    thin_to_weights,
)
from trainwright.checkpoint.rng import get_rng_state, set_rng_state
from trainwright.checkpoint.settings import CheckpointSettings
from trainwright.checkpoint.stateful import PieceNotReady, Stateful, check_state_dict, make_safe
from trainwright.checkpoint.storage import Location, RemotePath, location
from trainwright.registry import did_you_mean

_TMP_NAME = re.compile(r"^\..+\.tmp\.(?P<pid>\d+)\.[0-9a-f]+$")


class ResumeDisagreeError(RuntimeError):
    """Under several processes, the ranks would resume from different checkpoints (raised on every rank, before any
    reads one)."""

    #: Raised on every rank at the same point: the ranks can still meet in collectives.
    raised_on_every_rank = True


class CheckpointStrategy(Protocol):
    """What the manager needs of a strategy (:class:`~trainwright.strategies.Strategy` has it all)."""

    checkpoint_suffix: str
    resumable_suffixes: tuple[str, ...]
    run_failed: bool

    @property
    def rank(self) -> int: ...  # noqa: D102
    @property
    def world_size(self) -> int: ...  # noqa: D102
    @property
    def is_main_process(self) -> bool: ...  # noqa: D102
    def save_checkpoint(
        self,
        path: str | Path | RemotePath,
        state: Mapping[str, Any],
        *,
        async_save: bool = False,
        after: Callable[[], None] | None = None,
    ) -> None: ...  # noqa: D102
    def wait_for_checkpoint(self) -> None: ...  # noqa: D102
    def load_checkpoint(self, path: str | Path | RemotePath, map_location: Any = "cpu") -> dict[str, Any]: ...  # noqa: D102
    def read_checkpoint(self, path: str | Path | RemotePath, map_location: Any = "cpu") -> dict[str, Any]: ...  # noqa: D102
    def find_resumable(self, ckpt_dir: str | Path | RemotePath) -> tuple[Location, dict[str, Any]] | None: ...  # noqa: D102
    def remove_checkpoint(self, path: str | Path | RemotePath) -> None: ...  # noqa: D102
    def broadcast_object(self, obj: Any, src: int = 0) -> Any: ...  # noqa: D102
    def gather_object(self, obj: Any) -> list[Any]: ...  # noqa: D102


class Position(Protocol):
    """Where training stands (:class:`~trainwright.utils.progress.Progress`)."""

    epoch: int
    iteration: int
    iter_in_epoch: int


class RngState:
    """Every global random generator; under several processes each rank's own."""

    def __init__(self, strategy: CheckpointStrategy) -> None:
        self.strategy = strategy

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        rng = get_rng_state()
        if self.strategy.world_size > 1:  # a collective: state_dict() runs on every rank
            return {**rng, "per_rank": list(self.strategy.gather_object(rng))}
        return rng

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        per_rank, rank = state.get("per_rank"), self.strategy.rank
        set_rng_state(per_rank[rank] if per_rank and rank < len(per_rank) else dict(state))


class SaveRecord:
    """The files a run keeps: periodic ones (oldest first), the best per metric key (best first), the last saved
    iteration.

    The checkpoint hook persists it as its state, so keep-k and best-k go on across a resume.
    """

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.best: dict[str, list[tuple[float, str]]] = {}
        self.last_saved_iter = -1

    def names(self) -> set[str]:
        """Every file still wanted."""
        return set(self.kept) | {n for ranked in self.best.values() for _, n in ranked}

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        first = next(iter(self.best.values()), None)
        return {
            "kept": list(self.kept),
            "best": [[s, n, k] for k, ranked in self.best.items() for s, n in ranked],
            "best_score": first[0][0] if first else None,
            "best_ckpt": first[0][1] if first else None,
            "last_saved_iter": self.last_saved_iter,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: D102
        self.kept = list(state.get("kept", []))
        self.best = {}
        for score, name, key in state.get("best") or []:
            self.best.setdefault(str(key), []).append((float(score), str(name)))
        self.last_saved_iter = int(state.get("last_saved_iter", -1))


class CheckpointManager:
    """Saves, names, keeps, publishes and restores one run's checkpoints.

    Files are named with the strategy's suffix. Besides periodic saves the manager serves
    "save now" requests, publishes stripped copies, removes stale temporaries and holds the
    folder's lock. Whether the folder is remote (an fsspec URL,
    :mod:`trainwright.checkpoint.storage`) is decided once, when it is configured; the lock
    then guards the local ``work_dir`` only.

    Args:
        strategy: Does the I/O (format, ranks, async writes).
        pieces: Name -> :class:`Stateful`, in load order; a None value reserves a name for a
            piece added later (``manager.pieces[name] = piece``). ``rng`` is appended by the manager.
        ckpt_dir: Where files go (relative names are put there): a local folder, or a URL / :class:`RemotePath`
            (``s3://bucket/run``); a checkpoint whose upload keeps failing is kept in ``<ckpt_dir's
            parent>/checkpoints_unuploaded``
            of the local folder given here.
        progress: Names and dates "save now" checkpoints.
        keep: Periodic checkpoints kept (-1: all); older ones are deleted after the new ``latest``.
        async_save: Write in a background thread (the loop waits for the copy to CPU memory).
        logger: Where saves, publishing and resume messages go.
        flush: Runs once before the pieces are collected (the trainer's log flush: a resumed
            run does not log those lines again).
        before_save: Gets the collected dict before it is checked and written (``before_save_checkpoint`` hooks).
        after_save: Gets the path after each periodic or best save (``after_save_checkpoint`` hooks: the logger hook
            copies the logs then).
        after_load: Gets the loaded dict after every piece but ``rng`` is restored (``after_load_checkpoint`` hooks).
        required: Pieces a checkpoint must hold to be restored here.
        optional: Pieces a checkpoint may lack without a warning.
        settings: Where checkpoints go and what they hold (``Trainer(checkpoint=dict(...))``): its ``out_dir`` replaces
            ``ckpt_dir``; keep-k, async writes, names (``epoch_names`` too) and the pieces left out come from it too.
        record: The files kept and the last saved iteration (the checkpoint hook's state, so a save before
            ``train()`` is recorded as one during it); None: a record of its own.
    """

    def __init__(
        self,
        strategy: CheckpointStrategy,
        pieces: Mapping[str, Stateful | None],
        ckpt_dir: str | Path,
        *,
        progress: Position,
        keep: int = -1,
        async_save: bool = False,
        logger: logging.Logger | None = None,
        flush: Callable[[], None] | None = None,
        before_save: Callable[[dict[str, Any]], None] | None = None,
        after_load: Callable[[dict[str, Any]], None] | None = None,
        after_save: Callable[[Location], None] | None = None,
        required: Collection[str] = (),
        optional: Collection[str] = (),
        settings: CheckpointSettings | None = None,
        record: SaveRecord | None = None,
    ) -> None:
        self.strategy = strategy
        self.pieces: dict[str, Stateful | None] = dict(pieces)
        first = location(ckpt_dir)
        self._local_dir = (
            first if isinstance(first, Path) else None
        )  # the lock's folder; its parent holds checkpoints_unuploaded
        self.ckpt_dir: Location = self._where(first)
        self.progress = progress
        self.keep = keep
        self.async_save = async_save
        self.logger = logger or logging.getLogger("trainwright")
        self.flush, self.before_save, self.after_load, self.after_save = flush, before_save, after_load, after_save
        self.required, self.optional = tuple(required), frozenset(optional)
        #: Older periodic checkpoints whose number is a multiple of it are thinned to weights, not deleted (0: none).
        self.weights_every = 0
        #: Pieces left out of periodic, best and save-now checkpoints (e.g. ``optim_wrapper``).
        self.exclude: tuple[str, ...] = ()
        #: Templates of periodic names (one ``{}``); ``epoch_names``: a save at an epoch end takes the epoch name.
        self.epoch_tmpl, self.iter_tmpl, self.epoch_names = "epoch_{}.pth", "iter_{}.pth", False
        #: The storage settings it was built with (``Trainer(checkpoint=...)``, the checkpoint hook's).
        self.settings = settings or CheckpointSettings()
        if settings is not None:
            if settings.out_dir is not None:
                self.ckpt_dir = self._where(settings.out_dir)
            self.keep, self.async_save, self.exclude = settings.max_keep_ckpts, settings.async_save, settings.exclude
            self.weights_every = settings.weights_every
            self.epoch_tmpl, self.iter_tmpl = settings.epoch_tmpl, settings.iter_tmpl
            self.epoch_names = settings.epoch_names
        #: The files kept (periodic, best per key) and the last saved iteration.
        self.record = record if record is not None else SaveRecord()
        self._rng = RngState(strategy)
        # the lock guards the local folder (work_dir/checkpoints) even when the files go to a remote out_dir; a manager
        # made on a URL has none
        self._lock = WorkDirLock(self._local_dir) if self._local_dir is not None else None
        #: The checkpoint restored last and the iteration it put training at (None: none was restored).
        self.restored: tuple[Location, int] | None = None
        #: The newer checkpoints the last ``find_and_restore()`` skipped, and why (``(path, reason)``).
        self.skipped: list[tuple[Location, str]] = []

    def configure(self, **settings: Any) -> None:
        """Set storage settings by name (``ckpt_dir``, ``keep``, ``async_save``, ``exclude``, ``epoch_tmpl``,
        ``iter_tmpl``, ``epoch_names``, ``record``)."""
        for k, v in settings.items():
            if k not in (
                "ckpt_dir",
                "keep",
                "async_save",
                "exclude",
                "epoch_tmpl",
                "iter_tmpl",
                "epoch_names",
                "record",
            ):
                raise TypeError(f"CheckpointManager.configure: unknown setting {k!r}")
            setattr(self, k, self._where(v) if k == "ckpt_dir" else tuple(v) if k == "exclude" else v)

    @property
    def unuploaded_dir(self) -> Path:
        """Where a checkpoint whose upload to a remote ``ckpt_dir`` kept failing is written instead
        (``work_dir/checkpoints_unuploaded``)."""
        return (self._local_dir.parent if self._local_dir is not None else Path.cwd()) / "checkpoints_unuploaded"

    def _where(self, ckpt_dir: str | Path | RemotePath) -> Location:
        """``ckpt_dir`` as a local Path or a RemotePath (decided here, once); a remote store learns where failed
        uploads go."""
        loc = location(ckpt_dir)
        if isinstance(loc, RemotePath):
            if not getattr(self.strategy, "remote_checkpoints", True):
                raise ValueError(
                    f"Checkpoints in {loc.url}: strategy "
                    f"{getattr(self.strategy, 'name', type(self.strategy).__name__)!r} writes its checkpoints to local "
                    "disk "
                    "only. Give CheckpointHook a local out_dir (and copy the folder to object storage yourself), or "
                    "use strategy='fsdp' / 'ddp'"
                )
            loc.store.fallback_dir = self.unuploaded_dir
        return loc

    # -- the pieces ---------------------------------------------------------------------------
    @property
    def stateful(self) -> dict[str, Stateful]:
        """Every checkpointed piece by name, in load order (``rng`` last)."""
        return {**{k: p for k, p in self.pieces.items() if p is not None}, "rng": self._rng}

    def add(self, name: str, piece: Stateful) -> None:
        """Save ``piece`` in every checkpoint under ``name`` (before ``rng``); resume loads it back.

        Raises:
            TypeError: ``piece`` lacks ``state_dict`` / ``load_state_dict``.
            ValueError: ``name`` is taken.
        """
        if not isinstance(piece, Stateful):
            raise TypeError(
                f"register_stateful({name!r}, ...) needs an object with state_dict() and load_state_dict(state), got "
                f"{type(piece).__name__}"
            )
        if name in self.pieces or name in ("meta", "rng"):
            raise ValueError(
                f"register_stateful: the name {name!r} is already taken (taken: {[*self.pieces, 'rng']}); register "
                "under another name"
            )
        self.pieces[name] = piece

    def state_dict(self, exclude: Collection[str] = ()) -> dict[str, Any]:
        """The checkpoint dict: flush, every piece but ``exclude``, the ``before_save`` callable, made safe.

        Raises:
            TypeError: the dict holds an object the safe loader would refuse (names its key path).
        """
        if self.flush is not None:
            self.flush()
        ckpt = {name: piece.state_dict() for name, piece in self.stateful.items() if name not in exclude}
        if self.before_save is not None:
            self.before_save(ckpt)
        return make_safe(ckpt)  # type: ignore[no-any-return]

    def capture(self, exclude: Collection[str] = ()) -> dict[str, Any]:
        """An in-memory checkpoint: :meth:`state_dict` with every tensor copied, so later steps leave it unchanged.

        ``restore(captured, Path("<memory>"))`` puts the trainer back where it was (LR finder,
        spike-guard rollback, NaN replay). Under several processes this is a collective, as a save is.
        """
        from trainwright.checkpoint.async_writer import snapshot

        return snapshot(self.state_dict(exclude))  # type: ignore[no-any-return]

    def restore_captured(self, captured: dict[str, Any]) -> None:
        """:meth:`restore` a :meth:`capture`, which stays unchanged however often it is restored.

        torch's ``Optimizer.load_state_dict`` keeps the tensors it is given: restoring the capture
        itself would let the next steps update its optimizer state in place, and a second restore
        of the same capture (a second spike-guard rollback to it) would not go back to it.
        """
        from trainwright.checkpoint.async_writer import snapshot

        self.restore(snapshot(captured), Path("<memory>"))

    # -- saving ---------------------------------------------------------------------------------
    def name(self, tmpl: str, n: int) -> str:
        """The file name ``tmpl`` gives ``n``, with the strategy's suffix (``.pth``; a DCP directory's ``.dcp``...)."""
        name, suffix = tmpl.format(n), self.strategy.checkpoint_suffix
        return name if suffix == CHECKPOINT_SUFFIX else name[: -len(CHECKPOINT_SUFFIX)] + suffix

    def save(
        self,
        name: str | Path,
        *,
        exclude: Collection[str] | None = None,
        async_save: bool = False,
        latest: bool = False,
        remove: Sequence[str] = (),
        after: Callable[[], None] | None = None,
        thin: Sequence[str] = (),
    ) -> Location:
        """Write one checkpoint (a bare name goes in ``ckpt_dir``); once complete, rank 0 points ``latest`` at it,
        deletes ``remove`` (``thin``: after copying their weights to ``weights/``), runs ``after``.

        In a remote ``ckpt_dir`` "complete" means uploaded: an upload that keeps failing leaves the
        file in :attr:`unuploaded_dir` with a warning, and ``latest`` and the old files as they were.

        Raises:
            RuntimeError: under several processes, after this process's run failed (the
                strategy's ``run_failed``): a save is a collective (every rank's pieces, RNG
                states gathered) that the other processes are not in, so nothing is written.
        """
        path = location(name, within=self.ckpt_dir)
        if isinstance(path, Path) and not path.is_absolute() and path.parent == Path("."):
            path = self.ckpt_dir / path.name
        refused = self.refusal(path)
        if refused is not None:
            raise RuntimeError(refused)
        wanted = self.record.names() | {path.name}
        remove = [r for r in remove if r not in wanted]  # a name dropped from one list may be kept by the other

        def drop_old() -> None:
            for old in remove:
                if old in thin:  # its weights stay (checkpoint/retention.py), then the whole checkpoint goes
                    thin_to_weights(self.strategy.read_checkpoint, path.parent / old)
                self.strategy.remove_checkpoint(path.parent / old)

        def finish() -> None:
            if latest:
                write_latest(path.parent, path.name)
            when_durable(drop_old)  # older files go only once the new one survives a power loss
            if after is not None:
                after()

        state = self.state_dict(self.exclude if exclude is None else exclude)
        self.strategy.save_checkpoint(path, state, async_save=async_save, after=finish)
        return path

    def refusal(self, name: str | Path | RemotePath) -> str | None:
        """Why ``name`` cannot be saved now (None: it can): under several processes, after this process's run failed.

        A save is a collective then (every rank's pieces; the RNG states gathered) that the
        other processes are not in: they may be waiting in one of their own, which would
        receive this one's data.
        """
        if not (self.strategy.run_failed and self.strategy.world_size > 1):
            return None
        latest = read_latest(self.ckpt_dir)
        return (
            f"Not writing checkpoint {location(name, within=self.ckpt_dir).name}: the run failed on this process (rank "
            f"{self.strategy.rank}), and under several processes "
            "a save is a collective that the other processes are not in. Nothing was written; "
            + (
                f"the last complete checkpoint is {self.ckpt_dir / latest}: resume=True continues from it."
                if latest
                else "no checkpoint was written before."
            )
        )

    def save_periodic(self, name: str) -> Location:
        """Save ``name`` as the newest periodic checkpoint: ``latest`` points at it, then the oldest beyond ``keep``
        go."""
        r = self.record
        kept, dropped = [k for k in r.kept if k != name] + [name], []
        if self.keep > 0 and len(kept) > self.keep:
            dropped, kept = kept[: -self.keep], kept[-self.keep :]
        r.kept, r.last_saved_iter = kept, self.progress.iteration
        retention = Retention(self.keep, self.weights_every)
        return self._write(name, latest=True, remove=dropped, thin=[n for n in dropped if retention.thinned(n)])

    def save_best(self, key: str, score: float, name: str, *, greater: bool, keep: int = 1) -> Location | None:
        """Save ``name`` if ``score`` is among the ``keep`` best of ``key``; the file that falls out goes. None: not
        among them."""
        ranked = sorted(
            [*[b for b in self.record.best.get(key, []) if b[1] != name], (score, name)],
            key=lambda b: -b[0] if greater else b[0],
        )
        if (score, name) not in ranked[:keep]:
            return None
        self.record.best[key] = ranked[:keep]
        return self._write(name, latest=False, remove=[n for _, n in ranked[keep:]])

    def save_now(self) -> Location | None:
        """Checkpoint the current iteration now (preemption, end of training) unless it is saved already; complete on
        return."""
        p = self.progress
        if p.iteration == self.record.last_saved_iter:
            return None
        path = self.save_periodic(
            self.name(self.epoch_tmpl, p.epoch)
            if self.epoch_names and p.iter_in_epoch == 0
            else self.name(self.iter_tmpl, p.iteration)
        )
        self.strategy.wait_for_checkpoint()
        return path

    def _write(self, name: str, latest: bool, remove: list[str], thin: Sequence[str] = ()) -> Location:
        path = self.save(name, async_save=self.async_save, latest=latest, remove=remove, thin=thin)
        self.logger.info(
            f"Saving checkpoint {path} in the background" if self.async_save else f"Saved checkpoint {path}"
        )
        if self.after_save is not None:
            self.after_save(path)
        return path

    def preflight(self, saves: list[int] | None = None, at: int | None = None) -> None:
        """Refuse, before training, a run whose kept checkpoints would not fit in ``ckpt_dir``'s free space.

        One checkpoint's size is estimated from the tensor bytes of the model's and optimizer's state now (the
        largest checkpoint already in the folder if that is larger); ``saves``: the numbers of the periodic saves the
        run will make; ``at``: the iteration of a check during the run (the checkpoint hook checks again after its
        second save, when one is on disk: an optimizer's state made at its first step is counted then).
        The free space is the local disk's, or the store's where it tells (:class:`~trainwright.checkpoint.retention.
        ReportsFreeSpace`); unknown: nothing is checked.

        Raises:
            CheckpointSpaceError: naming the sizes, the free space and the fix (on every rank).
        """
        free = free_bytes(self.ckpt_dir) if self.strategy.is_main_process else None
        big = [n for n in ("model", "optim_wrapper") if n not in self.exclude]  # the rest is small, and may gather
        state = {name: piece.state_dict() for name, piece in self.pieces.items() if piece is not None and name in big}
        full, weights = tensor_bytes(state), tensor_bytes(state.get("model"))
        existing, on_disk = 0, 0
        if free is not None:
            found = list_checkpoints(self.ckpt_dir, suffix=self.strategy.resumable_suffixes)
            existing, on_disk = len(found), max([0, *map(_file_size, found)])
        retention = Retention(self.keep, self.weights_every)
        why = preflight(
            self.ckpt_dir,
            max(full, on_disk),
            weights,
            retention,
            saves,
            free,
            existing=existing,
            at=at,
            measured=on_disk > full,
        )
        if self.strategy.world_size > 1:
            why = self.strategy.broadcast_object(why)
        if why is not None:
            raise CheckpointSpaceError(why)

    # -- publishing and cleaning ----------------------------------------------------------------
    def check_keys(self, keys: Sequence[str]) -> None:
        """Raise ValueError naming the first of ``keys`` that is no top-level key of these checkpoints."""
        names = list(self.stateful)
        for key in keys:
            if key not in names:
                hint = " (mmengine's 'state_dict' is trainwright's 'model')" if key == "state_dict" else ""
                raise ValueError(
                    f"CheckpointHook published_keys: {key!r} is not a key of this trainer's checkpoints "
                    f"{names}{hint}.{did_you_mean(key, names)} "
                    "Publish some of those, e.g. published_keys=['meta', 'model']"
                )

    def publish(self, path: Location, keys: Sequence[str]) -> Location:
        """Write ``path`` stripped to ``keys`` as ``<stem>-<sha256[:8]>.pth`` beside it (call on rank 0); the hash is of
        the file's bytes.

        A sharded checkpoint (an FSDP ``.dcp`` directory) is read whole on this rank alone (the
        strategy's ``read_checkpoint``: full tensors, no collective), so its published file is a
        single ``.pth`` with the full weights.
        """
        ckpt = self.strategy.read_checkpoint(path)
        removed = [k for k in ckpt if k not in keys]
        buf = io.BytesIO()
        torch.save({k: ckpt[k] for k in keys if k in ckpt}, buf)
        data = buf.getvalue()
        out = path.with_name(f"{path.stem}-{hashlib.sha256(data).hexdigest()[:8]}.pth")
        write_whole(out, data)
        self.logger.info(
            f"Published {path.name} as {out} with keys {list(keys)}" + (f" (left out {removed})" if removed else "")
        )
        return out

    def clean_stale_tmp(self) -> None:
        """Remove temporaries that killed writers left in ``ckpt_dir`` (those of processes that no longer exist, and
        this one's)."""
        d = self.ckpt_dir
        if (
            isinstance(d, RemotePath) or not d.is_dir()
        ):  # a remote folder holds no temporaries: an object is complete or absent
            return
        self.strategy.wait_for_checkpoint()  # no write of this process is in flight: its temporary files are stale too
        for p in d.iterdir():
            m = _TMP_NAME.match(p.name)
            if m is not None and (int(m["pid"]) == os.getpid() or not _pid_alive(int(m["pid"]))):
                self.strategy.remove_checkpoint(p)  # a file, or a sharded checkpoint's directory
                self.logger.info(f"Removed {p.name}, left by a checkpoint write that was interrupted")

    # -- the folder's lock ----------------------------------------------------------------------
    def lock(self) -> None:
        """Rank 0 takes the folder's lock (:mod:`trainwright.checkpoint.lock`); every rank gets its answer.

        Raises:
            WorkDirBusyError: another live process holds it (on every rank).
        """
        error = stale = None
        if self._lock is None:
            return
        if self.strategy.is_main_process:
            try:
                stale = self._lock.acquire()
            except WorkDirBusyError as e:
                error = str(e)
        if self.strategy.world_size > 1:
            error = self.strategy.broadcast_object(error)
        if error is not None:
            raise WorkDirBusyError(error)
        if stale is not None and self._lock is not None:
            self.logger.warning(
                f"Took over the lock of {self._lock.path.parent} from {stale}: that process ended without releasing it "
                "(killed or crashed)"
            )

    def unlock(self) -> None:
        """Release the lock if this process holds it."""
        if self._lock is not None:
            self._lock.release()

    # -- restoring ------------------------------------------------------------------------------
    def find_and_restore(self, path: str | Path | RemotePath | None = None) -> tuple[Location, dict[str, Any]] | None:
        """Restore ``path``, or (None) the newest checkpoint of ``ckpt_dir`` that loads (a corrupt one is skipped, with
        a warning).

        Returns:
            ``(path, checkpoint)`` restored, or None when ``ckpt_dir`` holds no checkpoint.

        Raises:
            ResumeDisagreeError: under several processes, the ranks' newest checkpoints differ
                (one collective first, before any rank reads one: a sharded read is a
                collective itself, which the ranks that found another would not join).
        """
        if path is None and self.strategy.world_size > 1:
            self._agree_on_newest()
        if path is None:
            path = self._newer_kept_copy()
        self.skipped = []
        if path is None:
            with recording_skips() as self.skipped:
                found = self.strategy.find_resumable(self.ckpt_dir)
            if found is None:
                return None
            path, ckpt = found
        else:
            path = location(path, within=self.ckpt_dir)  # a URL under ckpt_dir keeps its store's options
            ckpt = self.strategy.load_checkpoint(path)
        return self._restored_from(path, ckpt)

    def _newer_kept_copy(self) -> Path | None:
        """A checkpoint kept in ``checkpoints_unuploaded`` (its upload failed) newer than the newest in the remote
        ``ckpt_dir``, if any.

        One process resumes from it, with a warning; several only warn (the kept copy is on
        rank 0's disk), naming ``resume=`` for it.
        """
        from trainwright.checkpoint.listing import list_checkpoints, step_of

        kept_dir = self.unuploaded_dir
        if not isinstance(self.ckpt_dir, RemotePath) or not kept_dir.is_dir():
            return None
        suffix = self.strategy.resumable_suffixes
        kept = list_checkpoints(kept_dir, suffix=suffix)
        if not kept:
            return None
        remote = list_checkpoints(self.ckpt_dir, suffix=suffix)
        if remote and step_of(remote[0].name) >= step_of(kept[0].name):
            return None
        newest = (
            f"than {remote[0].name}, the newest in {self.ckpt_dir}" if remote else f"and {self.ckpt_dir} holds none"
        )
        if self.strategy.world_size > 1:
            warnings.warn(
                f"resume=True: {kept[0]} (kept locally when its upload failed) is newer {newest}; resuming from the "
                "remote one. "
                f"To continue from the kept one, copy it to {self.ckpt_dir} or pass resume='{kept[0]}'",
                stacklevel=3,
            )
            return None
        warnings.warn(
            f"resume=True: resuming from {kept[0]}, kept locally when its upload failed: it is newer {newest}. "
            f"Copy it to {self.ckpt_dir} when the storage is back",
            stacklevel=3,
        )
        return kept[0]  # type: ignore[return-value]  # a local path: kept_dir is local

    def restore_if_training_checkpoint(self, path: str | Path | RemotePath) -> tuple[Location, dict[str, Any]] | None:
        """Restore ``path`` when it is a training checkpoint (a dict with every required piece); None, changing nothing,
        when it is not (weights).

        mmengine's ``resume=True`` with ``load_from=PATH`` resumes from ``PATH``: the Trainer asks this
        when its own checkpoint folder has nothing to resume.
        """
        path = location(path, within=self.ckpt_dir)
        ckpt = self.strategy.load_checkpoint(path)
        if not isinstance(ckpt, dict) or any(key not in ckpt for key in self.required):
            return None
        return self._restored_from(path, ckpt)

    def _restored_from(
        self, path: str | Path | RemotePath | Location, ckpt: dict[str, Any]
    ) -> tuple[Location, dict[str, Any]]:
        """:meth:`restore` ``ckpt`` read from ``path`` and note it as :attr:`restored`."""
        where = location(path, within=self.ckpt_dir)
        self.restore(ckpt, where)
        self.restored = (where, self.progress.iteration)
        return where, ckpt

    def _agree_on_newest(self) -> None:
        """Every rank must see the same newest checkpoint (by name: work dirs may be node-local copies under other
        paths)."""
        from trainwright.checkpoint.listing import list_checkpoints

        found = list_checkpoints(self.ckpt_dir, suffix=self.strategy.resumable_suffixes)
        everyone = self.strategy.gather_object(str(found[0]) if found else None)
        if len({None if f is None else Path(f).name for f in everyone}) > 1:
            raise ResumeDisagreeError(
                "The processes of this run would resume from different checkpoints: "
                + "; ".join(
                    f"rank {r} finds no checkpoint" if f is None else f"rank {r} would resume from {f}"
                    for r, f in enumerate(everyone)
                )
                + ". Every rank must see the same checkpoints (one shared work_dir, or a copy of its checkpoints "
                "folder on every node); "
                "nothing was loaded or trained."
            )

    def restore(self, ckpt: Any, path: Location) -> None:
        """Load every piece of ``ckpt`` (read from ``path``): all checked first, then loaded, ``after_load``, RNG last.

        Raises:
            TypeError, KeyError: ``ckpt`` is not a training checkpoint.
            ValueError, RuntimeError: a piece does not fit (the message names ``path``); nothing was changed.
        """
        if not isinstance(ckpt, dict):
            raise TypeError(
                f"Checkpoint {str(path)!r} holds a {type(ckpt).__name__}, not a trainwright checkpoint dict; use "
                "load_from= for weights"
            )
        for key in self.required:
            if key not in ckpt:
                raise KeyError(
                    f"Checkpoint {str(path)!r} has no {key!r} entry: it is not a trainwright training checkpoint "
                    f"(keys: {sorted(ckpt)}); use load_from= for weights only"
                )
        ckpt = migrate(ckpt, repr(str(path)))
        pieces = self.stateful
        for name, piece in pieces.items():
            if name in ckpt:
                try:
                    check_state_dict(piece, ckpt[name])
                except PieceNotReady as e:
                    raise PieceNotReady(
                        f"Cannot restore checkpoint {str(path)!r} yet: {e}; nothing was loaded. Pass resume= to the "
                        "Trainer (train() restores it before training), or call trainer.build_train_loop() first"
                    ) from e
                except (ValueError, RuntimeError) as e:
                    raise type(e)(f"Checkpoint {str(path)!r} does not fit this trainer: {e}") from e
        for name in [n for n in pieces if n not in ckpt and n not in self.optional]:
            warnings.warn(f"Checkpoint {str(path)!r} holds no {name!r} state; {name} starts fresh", stacklevel=3)
        unbuilt = [name for name, piece in self.pieces.items() if piece is None and name in ckpt]
        if unbuilt:  # val() before train() with resume=: train() builds them and restores the checkpoint again
            self.logger.info(f"Restoring {path} without {unbuilt}: this trainer has not built them yet")
        rng = pieces.pop("rng")
        for name, piece in pieces.items():
            if name in ckpt:
                piece.load_state_dict(ckpt[name])
        if self.after_load is not None:
            self.after_load(ckpt)
        if "rng" in ckpt:
            rng.load_state_dict(ckpt["rng"])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _file_size(path: Location) -> int:
    """``path``'s size in bytes; 0 for a folder (a sharded checkpoint) or a file keep-k removed meanwhile (its
    deletion runs in the background once the newer checkpoint is durable)."""
    try:
        return path.stat().st_size if path.is_file() else 0
    except FileNotFoundError:
        return 0
