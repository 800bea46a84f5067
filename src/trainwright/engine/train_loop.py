"""detectron2's ``HookBase`` and ``TrainerBase``: a loop over iterations with hooks around each step.

What a detectron2 script writes — ``trainer.register_hooks([...])``, ``trainer.train(start_iter, max_iter)``, hooks
reading ``self.trainer.iter`` and ``self.trainer.storage`` — runs as it does there (the loop: :class:`TrainerBase`).
The scalars go to an :class:`~trainwright.engine.EventStorage` opened for each ``train()``.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainwright.engine.events import EventStorage

__all__ = ["HookBase", "TrainerBase"]

logger = logging.getLogger("trainwright.engine")

#: The events a :class:`HookBase` can handle, in the order a step meets them.
HOOK_EVENTS: tuple[str, ...] = ("before_train", "before_step", "after_backward", "after_step", "after_train")


class HookBase:
    """Base class of the hooks :class:`TrainerBase` calls; override the events you need.

    ``self.trainer`` is set by :meth:`TrainerBase.register_hooks` to a weak proxy of the
    trainer (as in detectron2: the hook and the trainer do not keep each other alive), so a
    hook reads ``self.trainer.iter``, ``self.trainer.storage``, ``self.trainer.model``...
    Keep :meth:`before_step` cheap and put slow work in :meth:`after_step`, so timers measure
    the step. A hook with state returns it from :meth:`state_dict` and takes it back in
    :meth:`load_state_dict`; the trainer's state holds it under the hook's class name.
    """

    trainer: Any = None

    def before_train(self) -> None:
        """Called once before the first step of ``train()``."""

    def after_train(self) -> None:
        """Called once after the last step, also when a step raised (``trainer.iter == trainer.max_iter`` only after
        a full run)."""

    def before_step(self) -> None:
        """Called before each step; ``self.trainer.iter`` is the step's 0-based iteration."""

    def after_backward(self) -> None:
        """Called after the backward pass of each step, before the optimizer steps (gradients are there to read or
        change)."""

    def after_step(self) -> None:
        """Called after each step; ``self.trainer.iter`` is still the iteration just run."""

    def state_dict(self) -> dict[str, Any]:
        """The hook's state for checkpoints; stateless hooks return ``{}``."""
        return {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            NotImplementedError: the state is not empty but the hook does not override this
                method (it saved state it cannot take back).
        """
        if state_dict:
            raise NotImplementedError(
                f"{type(self).__qualname__}.state_dict() returns state but {type(self).__qualname__} does not define "
                "load_state_dict(); define it to resume the hook"
            )


def _state_keys(hooks: Iterable[HookBase]) -> list[str]:
    """One key per hook: its class's qualified name (detectron2's), ``Name#2``, ``Name#3``... for further hooks of
    that class."""
    seen: dict[str, int] = {}
    keys = []
    for h in hooks:
        name = type(h).__qualname__
        seen[name] = seen.get(name, 0) + 1
        keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return keys


class TrainerBase:
    """An iterative trainer with hooks; a subclass implements :meth:`run_step`.

    The loop, in pseudocode::

        hook.before_train()                      # every registered hook, in order
        for trainer.iter in range(start_iter, max_iter):
            hook.before_step()
            trainer.run_step()                   # SimpleTrainer: data, forward, backward,
                                                 #   hook.after_backward(), metrics, optimizer.step()
            hook.after_step()
        trainer.iter = max_iter                  # after_train can tell a finished run from a failed one
        hook.after_train()                       # also when a step raised (in a finally)

    Attributes:
        iter: The iteration being run (0-based); ``max_iter`` once ``train()`` finished.
        start_iter: The first iteration of the current ``train()``.
        max_iter: The iteration ``train()`` stops before.
        storage: The :class:`~trainwright.engine.EventStorage` of the current (or last)
            ``train()``.
    """

    def __init__(self) -> None:
        self._hooks: list[HookBase] = []
        self._calls: dict[str, list[Callable[[], None]]] = {event: [] for event in HOOK_EVENTS}
        self.iter: int = 0
        self.start_iter: int = 0
        self.max_iter: int = 0
        self.storage: EventStorage = EventStorage(0)

    # -- hooks ----------------------------------------------------------------------------------
    def register_hooks(self, hooks: Iterable[HookBase | None]) -> None:
        """Add hooks, run in the order given; ``None`` entries are skipped (detectron2's way to switch one off).

        Raises:
            TypeError: an entry is not a :class:`HookBase` (a trainwright ``Hook`` goes to
                ``trainwright.Trainer(custom_hooks=[...])`` instead).
        """
        new = [h for h in hooks if h is not None]
        for h in new:
            if not isinstance(h, HookBase):
                raise TypeError(
                    "register_hooks takes trainwright.engine.HookBase instances (detectron2's hooks), got "
                    f"{type(h).__name__}. "
                    "Subclass trainwright.engine.HookBase; a trainwright.Hook belongs to "
                    "trainwright.Trainer(custom_hooks=[...])"
                )
        for h in new:
            h.trainer = weakref.proxy(self)
        self._hooks.extend(new)
        # which hooks handle which event, decided once: a hook that overrides nothing costs nothing per step
        self._calls = {
            event: [getattr(h, event) for h in self._hooks if getattr(type(h), event) is not getattr(HookBase, event)]
            for event in HOOK_EVENTS
        }

    @property
    def hooks(self) -> list[HookBase]:
        """The registered hooks, in calling order."""
        return list(self._hooks)

    # -- the loop -------------------------------------------------------------------------------
    def train(self, start_iter: int, max_iter: int) -> None:
        """Run iterations ``start_iter`` .. ``max_iter - 1`` with the hooks around each.

        A second call continues where the caller says: ``train(0, 100)`` then
        ``train(100, 200)`` runs 200 steps over one data stream (each call has its own storage).

        Raises:
            ValueError: the bounds are not ints with ``0 <= start_iter <= max_iter``.
            Exception: whatever a step or hook raised, after it is logged and ``after_train``
                hooks ran.
        """
        if not (isinstance(start_iter, int) and isinstance(max_iter, int)) or not 0 <= start_iter <= max_iter:
            raise ValueError(
                "train(start_iter, max_iter) needs ints with 0 <= start_iter <= max_iter, got "
                f"start_iter={start_iter!r}, max_iter={max_iter!r}"
            )
        logger.info("Starting training from iteration %d", start_iter)
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        with EventStorage(start_iter) as self.storage:
            try:
                self.before_train()
                for self.iter in range(start_iter, max_iter):
                    self.before_step()
                    self.run_step()
                    self.after_step()
                self.iter = max_iter
            except Exception:
                logger.exception("Exception during training at iteration %d:", self.iter)
                raise
            finally:
                self.after_train()

    def run_step(self) -> None:
        """One iteration of training; subclasses implement it."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement run_step() (one training iteration), or use "
            "trainwright.engine.SimpleTrainer"
        )

    # -- dispatch (a subclass may extend these, calling super()) ---------------------------------
    def before_train(self) -> None:
        """Call every hook's ``before_train``."""
        for call in self._calls["before_train"]:
            call()

    def after_train(self) -> None:
        """Call every hook's ``after_train`` (the storage's iteration set to the trainer's)."""
        self.storage.iter = self.iter
        for call in self._calls["after_train"]:
            call()

    def before_step(self) -> None:
        """Set the storage's iteration to the step's, then call every hook's ``before_step``."""
        self.storage.iter = self.iter
        for call in self._calls["before_step"]:
            call()

    def after_backward(self) -> None:
        """Call every hook's ``after_backward`` (``run_step`` calls this between backward and the optimizer step)."""
        for call in self._calls["after_backward"]:
            call()

    def after_step(self) -> None:
        """Call every hook's ``after_step``."""
        for call in self._calls["after_step"]:
            call()

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"iteration": iter, "hooks": {name: state}}`` (hooks with empty state left out)."""
        state: dict[str, Any] = {"iteration": self.iter}
        hooks = {key: sd for key, h in zip(_state_keys(self._hooks), self._hooks) if (sd := h.state_dict())}
        if hooks:
            state["hooks"] = hooks
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the iteration and each hook's state, matched by the hook's class name.

        A saved hook state with no registered hook of that name is skipped with a warning, as
        in detectron2. Resume with ``trainer.train(trainer.iter + 1, max_iter)``: a saved
        ``iteration`` is the last one done.

        Raises:
            KeyError: ``state_dict`` has no ``"iteration"`` (not a trainer state).
        """
        if "iteration" not in state_dict:
            raise KeyError(
                f"Not a trainer state: no 'iteration' key (keys: {sorted(state_dict)}); pass what "
                "TrainerBase.state_dict() returned"
            )
        self.iter = int(state_dict["iteration"])
        by_key = dict(zip(_state_keys(self._hooks), self._hooks))
        for key, value in state_dict.get("hooks", {}).items():
            hook = by_key.get(key)
            if hook is None:
                logger.warning(
                    "Cannot find the hook %r among the registered hooks %s; its state is ignored", key, sorted(by_key)
                )
                continue
            hook.load_state_dict(value)
