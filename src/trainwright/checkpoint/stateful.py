"""The Stateful protocol: anything a checkpoint saves and restores by name.

A trainer's checkpoint is a dict ``name -> piece.state_dict()`` over one mapping of
named pieces (model, optimizer, schedulers, progress, hooks, RNG, user objects...); resume
calls ``piece.load_state_dict(checkpoint[name])`` for each. This is torchtnt's ``Stateful``
(and the shape ``torch.distributed.checkpoint`` expects), so a sharded strategy can save
and load the same mapping its own way.

A piece may also define ``check_state_dict(state)``: it raises (``ValueError`` /
``RuntimeError`` with a message that says what does not match and how to fix it) when
``state`` cannot be loaded into it. Resume runs every piece's check before it loads any
piece, so a checkpoint that does not fit leaves everything as it was.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Stateful(Protocol):
    """An object whose state is saved with ``state_dict()`` and restored with ``load_state_dict()``.

    The state must hold only tensors and plain containers (dict, list, tuple, str, numbers,
    bool, None; NumPy values are converted when the checkpoint is written) so that the
    checkpoint loads with ``torch.load(weights_only=True)``.
    """

    def state_dict(self) -> dict[str, Any]:
        """Return the state to save."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state returned by :meth:`state_dict`."""
        ...


def check_state_dict(piece: Any, state: Any) -> None:
    """Run ``piece.check_state_dict(state)`` if the piece defines it (see the module docstring)."""
    check = getattr(piece, "check_state_dict", None)
    if callable(check):
        check(state)
