"""Checkpointer: the trainer's checkpoint API (save, resume, weights, the checkpoint folder's lock).

The :class:`~trainwright.Trainer` builds one and delegates its public checkpoint methods
(``save_checkpoint``, ``state_dict``, ``register_stateful``, ``request_checkpoint``,
``load_weights``, ``save_weights``, ``stateful``...) to it, so the trainer wires the run and
this piece keeps what a checkpoint is made of and when it is written or read back. What
the pieces are and how they are collected and restored is :mod:`trainwright.trainer.state`.

Where one of these operations uses another (saving collects the state dict, a requested
checkpoint saves one, ``load_from`` loads weights), it goes through the trainer's public
method, so a Trainer subclass that overrides e.g. ``save_checkpoint`` sees every call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwright.checkpoint import Stateful
from trainwright.checkpoint.lock import WorkDirBusyError, WorkDirLock
from trainwright.trainer.runs import config_changes
from trainwright.trainer.state import BUILTIN_PIECES, collect_state, make_safe, restore_state, stateful_pieces

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer


class Checkpointer:
    """Saves and restores one trainer's state; holds what the trainer needs for it between runs.

    Args:
        trainer: The trainer whose state is saved and restored.
        resume: False, True (the newest complete checkpoint of ``trainer.ckpt_dir``) or a path.
        load_from: A checkpoint to load weights from (weights only) when nothing is resumed.
    """

    def __init__(self, trainer: Trainer, resume: bool | str | Path = False, load_from: str | Path | None = None) -> None:
        self.trainer = trainer
        self.resume = resume
        self.load_from = load_from
        self._applied = False  # resume / load_from were applied (once, before the first run; resume_from re-arms it)
        self._registered: dict[str, Stateful] = {}
        self._server: Callable[[Trainer], Path | None] | None = None
        self._lock = WorkDirLock(trainer.ckpt_dir)  # held while train() runs (rank 0)

    # -- the checkpoint folder --------------------------------------------------------------
    def lock_work_dir(self) -> None:
        """Rank 0 takes the checkpoint folder's lock (see :mod:`trainwright.checkpoint.lock`); every rank gets its answer.

        Raises:
            WorkDirBusyError: another live process holds the lock (on every rank).
        """
        trainer = self.trainer
        error = stale = None
        if trainer.is_main_process:
            try:
                stale = self._lock.acquire()
            except WorkDirBusyError as e:
                error = str(e)
        if trainer.strategy.world_size > 1:
            error = trainer.strategy.broadcast_object(error)
        if error is not None:
            raise WorkDirBusyError(error)
        if stale is not None:
            trainer.logger.warning(f"Took over the lock of {trainer.ckpt_dir} from {stale}: that process ended without releasing it (killed or crashed)")

    def unlock_work_dir(self) -> None:
        """Release the checkpoint folder's lock if this process holds it (a no-op otherwise)."""
        self._lock.release()

    # -- the state --------------------------------------------------------------------------
    @property
    def stateful(self) -> dict[str, Stateful]:
        """Every checkpointed piece by name, in load order: the one list that saving and resuming iterate.

        ``model``, ``optim_wrapper``, ``param_schedulers``, ``progress``,
        ``train_dataloader``, ``metric_store``, ``hooks`` (those that exist yet), the pieces
        given to :meth:`register`, then ``rng``. See :mod:`trainwright.trainer.state`.
        """
        return stateful_pieces(self.trainer, self._registered)

    def register(self, name: str, obj: Stateful) -> None:
        """Save ``obj.state_dict()`` in every checkpoint under ``name``; resume calls ``obj.load_state_dict``.

        ``obj`` may also define ``check_state_dict(state)``, which resume calls before it
        changes anything (raise to refuse a checkpoint). Register before ``train()`` /
        ``resume_from()``; a checkpoint without ``name`` leaves ``obj`` as it is, with a warning.

        Raises:
            TypeError: ``obj`` lacks ``state_dict`` / ``load_state_dict``.
            ValueError: ``name`` is taken (a built-in piece or an earlier registration).
        """
        if not isinstance(obj, Stateful):
            raise TypeError(f"register_stateful({name!r}, ...) needs an object with state_dict() and load_state_dict(state), got {type(obj).__name__}")
        if name in BUILTIN_PIECES or name in self._registered:
            raise ValueError(f"register_stateful: the name {name!r} is already taken (built-in pieces: {list(BUILTIN_PIECES)}); register under another name")
        self._registered[name] = obj

    def state_dict(self, save_optimizer: bool = True, save_param_scheduler: bool = True) -> dict[str, Any]:
        """The full checkpoint dict: every piece of :attr:`stateful`, then the ``before_save_checkpoint`` hooks.

        Raises:
            TypeError: the dict (hooks' additions included) holds an object that the safe
                loader would refuse; the message names its key path (NumPy values are converted).
        """
        ckpt = collect_state(self.trainer, save_optimizer, save_param_scheduler)
        self.trainer.hooks.call("before_save_checkpoint", self.trainer, ckpt)
        return make_safe(ckpt)  # type: ignore[no-any-return]

    # -- saving -----------------------------------------------------------------------------
    def save(self, path: str | Path, save_optimizer: bool = True, save_param_scheduler: bool = True, *, async_save: bool = False, after: Callable[[], None] | None = None) -> Path:
        """Write the full checkpoint (``trainer.state_dict()``) through the strategy (relative names go under ``ckpt_dir``).

        Args:
            path: The file; a bare name (``"x.pth"``) is put in ``ckpt_dir``.
            save_optimizer / save_param_scheduler: Include those pieces (needed to resume exactly).
            async_save: Return once the state is copied to CPU memory; the write runs in the
                background (``strategy.wait_for_checkpoint()`` waits for it).
            after: Runs on rank 0 once the file is complete (see ``Strategy.save_checkpoint``).

        Returns:
            The path written.
        """
        trainer = self.trainer
        path = Path(path)
        if not path.is_absolute() and path.parent == Path("."):
            path = trainer.ckpt_dir / path
        trainer.strategy.save_checkpoint(path, trainer.state_dict(save_optimizer, save_param_scheduler), async_save=async_save, after=after)
        return path

    def set_server(self, server: Callable[[Trainer], Path | None] | None) -> None:
        """Make ``server(trainer)`` serve :meth:`request` (the checkpoint hook does, while training); None: the trainer serves."""
        self._server = server

    def request(self) -> Path | None:
        """Checkpoint the current state now (e.g. on preemption); returns once the file is complete.

        Served by the checkpoint hook while it trains (its naming, ``latest`` and keep-k
        rules apply; it returns None when this iteration is saved already); without one the
        trainer writes ``ckpt_dir/iter_<N>.pth`` (``trainer.save_checkpoint``) and points ``latest`` at it.

        Returns:
            The path written, or None when nothing new had to be written.
        """
        trainer = self.trainer
        if self._server is not None:
            path = self._server(trainer)
        else:
            from trainwright.checkpoint.io import write_latest

            name = f"iter_{trainer.progress.iteration}{trainer.strategy.checkpoint_suffix}"
            path = trainer.save_checkpoint(name, after=lambda: write_latest(trainer.ckpt_dir, name))
        trainer.strategy.wait_for_checkpoint()
        return path

    # -- resuming ---------------------------------------------------------------------------
    def set_resume(self, path: str | Path) -> None:
        """Resume from ``path`` when :meth:`load_or_resume` runs next (``Trainer.resume_from`` runs it right away)."""
        self.resume = Path(path)
        self._applied = False

    def load_or_resume(self) -> None:
        """Apply ``resume`` (full state) or else ``load_from`` (weights only), once, before running.

        ``resume=True`` takes the newest checkpoint of ``ckpt_dir`` that loads (the
        strategy's ``find_resumable``: a corrupt one is skipped with a warning); when there
        is none, the run starts fresh from ``load_from`` if given. Every file is read with
        the safe loader and checked before anything in the trainer changes, so a refused,
        broken or mismatched file leaves the trainer as it was. A later call does nothing
        (until :meth:`set_resume`), even when this one raised.
        """
        if self._applied:
            return
        self._applied = True
        trainer, resume = self.trainer, self.resume
        if resume and trainer.train_loop is not None:
            if resume is True:
                found = trainer.strategy.find_resumable(trainer.ckpt_dir)
                if found is None:
                    trainer.logger.info(f"resume=True but no checkpoint in {trainer.ckpt_dir}; starting from scratch")
                else:
                    self._restore(*found)
                    return
            else:
                self._restore(Path(resume), trainer.strategy.load_checkpoint(resume))
                return
        if self.load_from is not None:
            trainer.load_weights(self.load_from)

    def _restore(self, path: Path, ckpt: Any) -> None:
        """Load the checkpoint ``ckpt`` read from ``path`` into the trainer; warn about settings that changed since it was written."""
        trainer = self.trainer
        if not isinstance(ckpt, dict):
            raise TypeError(f"Checkpoint {str(path)!r} holds a {type(ckpt).__name__}, not a trainwright checkpoint dict; use load_from= for weights")
        restore_state(trainer, ckpt, path)
        trainer.logger.info(f"Resumed from {path} at epoch {trainer.progress.epoch}, iteration {trainer.progress.iteration}")
        meta = ckpt.get("meta")
        changed = config_changes(meta.get("config") if isinstance(meta, Mapping) else None, trainer.config)
        if changed:
            trainer.logger.warning(
                f"Resumed from {path}: the model, the optimizer state (its lr, momentum...), the schedulers, the progress, the data order "
                "and the random streams come from the checkpoint. Settings that differ from the checkpoint's run: "
                + "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
                + ". train_cfg, hooks, data and the other settings apply as given now; edited optimizer or scheduler values do not "
                "(the checkpoint's win): to train with them, start a new run from these weights with load_from=."
            )

    # -- weights ----------------------------------------------------------------------------
    def load_weights(self, path: str | Path, strict: bool = False, revise_keys: Sequence[tuple[str, str]] = ((r"^module\.", ""),)) -> Any:
        """Load model weights (``.pth`` or ``.safetensors``), reporting key mismatches by name.

        Args:
            path: The weights, or a checkpoint holding them under ``"model"`` / ``"state_dict"``.
            strict: Whether missing or unexpected keys are an error (they are always listed).
            revise_keys: ``(pattern, replacement)`` key renames applied first (default: drop DDP's ``module.``).

        Returns:
            The missing and unexpected keys.
        """
        from trainwright.checkpoint.weights import load_model_weights

        trainer = self.trainer
        # once prepared, the strategy copies the weights in (a sharded model takes full tensors only through it)
        load = (lambda weights: trainer.strategy.load_model_state_dict(weights, strict=False)) if trainer.prepared else None
        result = load_model_weights(trainer.unwrapped_model, trainer.strategy.load_checkpoint(path), strict=strict, revise_keys=list(revise_keys), load=load)
        trainer.logger.info(f"Loaded weights from {path}")
        return result

    def save_weights(self, path: str | Path) -> Path:
        """Export the full model weights as safetensors (rank 0 writes; call it on every rank).

        Under a sharded strategy (FSDP) the weights are gathered to rank 0 first; the keys
        are the model's own (no ``module.`` prefix), whatever the strategy.
        """
        from trainwright.checkpoint.weights import save_safetensors

        trainer = self.trainer
        path = Path(path)
        state = trainer.strategy.full_model_state_dict() if trainer.prepared else trainer.unwrapped_model.state_dict()
        if trainer.is_main_process:
            save_safetensors(state, path)
        return path
