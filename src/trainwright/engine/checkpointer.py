"""detectron2's (fvcore's) ``Checkpointer``: a model and named pieces saved as one file, over trainwright's atomic save
and safe load.

``Checkpointer(model, save_dir, optimizer=..., trainer=...)`` writes
``save_dir/<name>.pth`` with ``{"model": ..., "optimizer": ..., "trainer": ..., **extra}`` and
names it in ``save_dir/last_checkpoint``, as fvcore does; the file is written atomically
(complete or absent) and read without executing code from it (``weights_only=True``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from trainwright import dist
from trainwright.checkpoint.io import atomic_save, atomic_write_text, load_file

__all__ = ["Checkpointer"]

_LAST = "last_checkpoint"


def _bare(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a data-parallel wrapper (every key under ``module.``), so files load with or without one."""
    inner = getattr(model, "module", None)
    if isinstance(inner, torch.nn.Module):
        keys = model.state_dict().keys()
        if keys and all(k.startswith("module.") for k in keys):
            return inner
    return model


class Checkpointer:
    """Save and load a model and other objects with ``state_dict()`` / ``load_state_dict()``.

    Args:
        model: The model; a DistributedDataParallel wrapper is saved as the model inside it.
        save_dir: The folder of the checkpoint files.
        save_to_disk: Whether this process writes (default: rank 0 only; every rank loads).
        **checkpointables: Other objects saved under their keyword, e.g. ``optimizer=opt,
            trainer=trainer`` (a :class:`~trainwright.engine.TrainerBase` saves its iteration,
            its hooks' states and its optimizer).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        save_dir: str | os.PathLike[str] = "",
        *,
        save_to_disk: bool | None = None,
        **checkpointables: Any,
    ) -> None:
        for key, obj in checkpointables.items():
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(
                    f"Checkpointer({key}=...) needs an object with state_dict() and load_state_dict(), got "
                    f"{type(obj).__name__}"
                )
        self.model = model
        self.save_dir = Path(save_dir)
        self.save_to_disk = dist.is_main_process() if save_to_disk is None else save_to_disk
        self.checkpointables = dict(checkpointables)

    def save(self, name: str, **kwargs: Any) -> None:
        """Write ``save_dir/<name>.pth`` (the model, every checkpointable, and ``kwargs``) and name it in
        ``last_checkpoint``."""
        if not self.save_to_disk:
            return
        data: dict[str, Any] = {"model": _bare(self.model).state_dict()}
        data.update({key: obj.state_dict() for key, obj in self.checkpointables.items()})
        data.update(kwargs)
        atomic_save(data, self.save_dir / f"{name}.pth")
        atomic_write_text(self.save_dir / _LAST, f"{name}.pth")

    def load(self, path: str | os.PathLike[str], checkpointables: Iterable[str] | None = None) -> dict[str, Any]:
        """Load ``path`` into the model and the checkpointables (all, or the keys named).

        Returns:
            What the file holds besides those (e.g. the ``iteration`` passed to :meth:`save`).

        Raises:
            FileNotFoundError: ``path`` does not exist.
            KeyError: the file has no ``"model"`` entry.
            RuntimeError: the weights do not fit the model (torch names the keys and shapes).
        """
        ckpt = dict(load_file(path))
        if "model" not in ckpt:
            raise KeyError(
                f"{path} has no 'model' entry (keys: {sorted(ckpt)}); it was not written by Checkpointer.save"
            )
        _bare(self.model).load_state_dict(ckpt.pop("model"))
        for key in self.checkpointables if checkpointables is None else checkpointables:
            if key in ckpt:
                self.checkpointables[key].load_state_dict(ckpt.pop(key))
        return ckpt

    def remove(self, name: str) -> None:
        """Delete ``save_dir/<name>.pth`` if this process writes and it exists (keep-k of
        :class:`~trainwright.engine.hooks.PeriodicCheckpointer`)."""
        path = self.save_dir / f"{name}.pth"
        if self.save_to_disk and path.exists():
            path.unlink()

    def has_checkpoint(self) -> bool:
        """Whether ``save_dir`` names a last checkpoint."""
        return (self.save_dir / _LAST).is_file()

    def get_checkpoint_file(self) -> str:
        """The last checkpoint's path, or ``""`` when there is none."""
        if not self.has_checkpoint():
            return ""
        return str(self.save_dir / (self.save_dir / _LAST).read_text().strip())

    def get_all_checkpoint_files(self) -> list[str]:
        """Every ``.pth`` file in ``save_dir``, sorted."""
        return sorted(str(p) for p in self.save_dir.glob("*.pth"))

    def resume_or_load(self, path: str | os.PathLike[str], *, resume: bool = True) -> dict[str, Any]:
        """Resume from the last checkpoint when ``resume`` and there is one (everything restored); else load only the
        model from ``path`` (``""``: nothing)."""
        if resume and self.has_checkpoint():
            return self.load(self.get_checkpoint_file())
        if not path:
            return {}
        return self.load(path, checkpointables=[])
