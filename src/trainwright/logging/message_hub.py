"""MessageHub: mmengine's store of runtime information and scalars that hooks and models read and write.

The run's own facts (``epoch``, ``iter``, ``max_epochs``, ``max_iters``, ``experiment_name``,
``seed``) are read from the run when asked, so nothing is copied per iteration; the logged
scalars (``train/loss``, ``train/lr``, ``val/acc``...) are the metric store's. What hooks and
models write (``update_info`` / ``update_scalar``) is kept here and saved with the checkpoint.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from trainwright.logging.history_buffer import HistoryBuffer

_MISSING = object()


class MessageHub:
    """Runtime information and scalars shared by hooks and models (mmengine's ``MessageHub``).

    ``trainer.message_hub`` is the run's; ``MessageHub.get_current_instance()`` returns the hub of
    the trainer built last (what mmengine's models and losses call), or an empty one.

    Args:
        name: The instance's name (:meth:`get_instance`).
        live: Information read from the run when asked: name → a function returning it.
        scalars: Finds a logged scalar's buffer by its logged name (``"loss"`` for ``train/loss``,
            ``"val/acc"``); None when there is none.
    """

    # weak: a hub (whose facts are read from its trainer) must not keep a closed trainer, its model and its process
    # group alive
    _instances: ClassVar[weakref.WeakValueDictionary[str, MessageHub]] = weakref.WeakValueDictionary()
    _current: ClassVar[weakref.ref[MessageHub] | None] = None

    def __init__(
        self,
        name: str = "trainwright",
        live: Mapping[str, Callable[[], Any]] | None = None,
        scalars: Callable[[str], HistoryBuffer | None] | None = None,
    ) -> None:
        self.instance_name = name
        self._live = dict(live or {})
        self._find_scalar = scalars
        self._info: dict[str, Any] = {}
        self._resumed_info: set[str] = set()
        self._scalars: dict[str, HistoryBuffer] = {}
        self._resumed_scalars: set[str] = set()
        MessageHub._instances[name] = self
        MessageHub._current = weakref.ref(self)

    # -- instances (mmengine's ManagerMixin) ---------------------------------------------------
    @classmethod
    def get_current_instance(cls) -> MessageHub:
        """The hub of the trainer built last (while that trainer exists); an empty hub when there is none."""
        hub = cls._current() if cls._current is not None else None
        return hub if hub is not None else cls()

    @classmethod
    def get_instance(cls, name: str, **kwargs: Any) -> MessageHub:
        """The hub called ``name``, created (with ``kwargs``) when there is none."""
        hub = cls._instances.get(name)
        return hub if hub is not None else cls(name, **kwargs)

    # -- information ------------------------------------------------------------------------
    def update_info(self, key: str, value: Any, resumed: bool = True) -> None:
        """Set ``key``; ``resumed=True`` saves it with the checkpoint. The run's own facts cannot be set."""
        if key in self._live:
            raise KeyError(
                f"MessageHub info {key!r} is the run's own (read from the trainer); it cannot be set. Use another key "
                "for your value"
            )
        self._info[key] = value
        (self._resumed_info.add if resumed else self._resumed_info.discard)(key)

    def update_info_dict(self, info: Mapping[str, Any], resumed: bool = True) -> None:
        """:meth:`update_info` for every item."""
        for key, value in info.items():
            self.update_info(key, value, resumed)

    def get_info(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (the run's own facts read now), or ``default``."""
        if key in self._live:
            return self._live[key]()
        return self._info.get(key, default)

    @property
    def runtime_info(self) -> dict[str, Any]:
        """Every piece of information, the run's own read now."""
        return {**{k: f() for k, f in self._live.items()}, **self._info}

    # -- scalars ----------------------------------------------------------------------------
    def update_scalar(self, key: str, value: float, count: int = 1, resumed: bool = True) -> None:
        """Append a number to the scalar ``key`` (``count`` is accepted for mmengine's signature and ignored)."""
        buf = self._scalars.get(key)
        if buf is None:
            buf = self._scalars[key] = HistoryBuffer()
        buf.update(float(value))
        (self._resumed_scalars.add if resumed else self._resumed_scalars.discard)(key)

    def update_scalars(self, log_dict: Mapping[str, float], resumed: bool = True) -> None:
        """:meth:`update_scalar` for every item."""
        for key, value in log_dict.items():
            self.update_scalar(key, value, resumed=resumed)

    def get_scalar(self, key: str) -> HistoryBuffer:
        """The buffer of ``key``: one written here, else the run's logged scalar (``train/loss``, ``val/acc``).

        Raises:
            KeyError: there is no such scalar (as in mmengine), naming the ones there are.
        """
        if key in self._scalars:
            return self._scalars[key]
        if self._find_scalar is not None:
            for name in (key, key[len("train/") :] if key.startswith("train/") else None):
                buf = self._find_scalar(name) if name else None
                if buf is not None and buf.count:
                    return buf
        raise KeyError(
            f"MessageHub has no scalar {key!r}; written here: {sorted(self._scalars)} (the run's logged scalars are "
            "read as 'train/<name>' and 'val/<name>')"
        )

    @property
    def log_scalars(self) -> dict[str, HistoryBuffer]:
        """The scalars written here."""
        return dict(self._scalars)

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The information and scalars written with ``resumed=True``."""
        return {
            "info": {k: self._info[k] for k in self._resumed_info if k in self._info},
            "scalars": {k: self._scalars[k].state_dict() for k in self._resumed_scalars},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        for key, value in state.get("info", {}).items():
            self.update_info(key, value)
        for key, buf_state in state.get("scalars", {}).items():
            buf = self._scalars[key] = HistoryBuffer()
            buf.load_state_dict(buf_state)
            self._resumed_scalars.add(key)
