"""mmengine's ``BaseStrategy`` building and restoring methods on every strategy: the run's parts without a Trainer.

``build_model`` / ``build_optim_wrapper`` / ``build_param_scheduler`` build through the same
registries and builders the Trainer uses; ``load_checkpoint_weights`` / ``resume`` /
``load_or_resume`` read a trainwright checkpoint through the strategy's own checkpoint methods
(so a sharded strategy reads its format) into the parts they are given. A script that drives a
strategy itself, as mmengine's strategy API allows, uses these; the Trainer wires the same
builders and restores every checkpoint piece (loops, data order, hooks) as well.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from trainwright.registry import MODELS

if TYPE_CHECKING:
    import torch

    from trainwright.amp.precision import Precision
    from trainwright.checkpoint.storage import Location, RemotePath
    from trainwright.checkpoint.weights import IncompatibleKeys


class StrategyParts:
    """mmengine's ``BaseStrategy.build_*`` / ``resume`` / ``load_or_resume``, for
    :class:`~trainwright.strategies.base.Strategy`."""

    if TYPE_CHECKING:  # what they use of the strategy (Strategy defines each)
        device: torch.device
        precision: Precision

        def unwrap_model(self, model: nn.Module | None = None) -> nn.Module: ...
        def setup_optim_wrapper(self, optim_wrapper: Any) -> Any: ...
        def load_checkpoint(self, path: str | Path | RemotePath, map_location: Any = "cpu") -> dict[str, Any]: ...
        def load_model_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any: ...
        def load_optim_state_dict(self, optim_wrapper: Any, state: Mapping[str, Any]) -> None: ...
        def find_resumable(self, ckpt_dir: str | Path | RemotePath) -> tuple[Location, dict[str, Any]] | None: ...

    def build_model(self, model: nn.Module | Mapping[str, Any]) -> nn.Module:
        """``model`` itself, or built from ``dict(type=...)`` of ``MODELS``.

        Raises:
            TypeError: it is (or builds) no ``nn.Module``.
        """
        built = MODELS.build(model)
        if not isinstance(built, nn.Module):
            raise TypeError(
                "build_model needs an nn.Module or a dict(type=...) of trainwright.registry.MODELS that builds one, "
                f"got {type(built).__name__}"
            )
        return built

    def build_optim_wrapper(self, optim_wrapper: Any, model: nn.Module | None = None) -> Any:
        """An optim wrapper over ``model`` (default: the prepared model) from a wrapper, an optimizer or a config dict,
        carried out by this strategy.

        The same builder as the Trainer's (paramwise_cfg, constructors, the strategy's precision).
        """
        from trainwright.optim.builder import build_optim_wrapper

        target = model if model is not None else self.unwrap_model()
        return self.setup_optim_wrapper(build_optim_wrapper(target, optim_wrapper, self.precision, self.device.type))

    def build_param_scheduler(
        self,
        scheduler: Any,
        optim_wrapper: Any,
        *,
        epoch_length: int | None = None,
        max_epochs: int | None = None,
        max_iters: int | None = None,
    ) -> list[Any] | dict[str, list[Any]]:
        """The param schedulers of ``optim_wrapper`` from a scheduler, a dict or a list of them (see
        :func:`~trainwright.optim.scheduler.build_param_schedulers`)."""
        from trainwright.optim.scheduler import build_param_schedulers

        return build_param_schedulers(
            scheduler, optim_wrapper, epoch_length, max_epochs=max_epochs, max_iters=max_iters
        )

    def load_checkpoint_weights(
        self,
        path: str | Path,
        *,
        strict: bool = False,
        revise_keys: Sequence[tuple[str, str]] = ((r"^module\.", ""),),
        map_location: Any = "cpu",
        callback: Callable[[dict[str, Any]], None] | None = None,
    ) -> IncompatibleKeys:
        """Load the weights of the checkpoint at ``path`` into the prepared model (mmengine's
        ``BaseStrategy.load_checkpoint``); return missing and unexpected keys.

        ``callback(checkpoint)`` may edit the checkpoint first. Keys are reported by name, a shape
        mismatch is always an error (see :func:`~trainwright.checkpoint.load_model_weights`).
        """
        from trainwright.checkpoint.weights import load_model_weights

        ckpt = self.load_checkpoint(path, map_location)
        if callback is not None:
            callback(ckpt)
        return load_model_weights(
            self.unwrap_model(),
            ckpt,
            strict=strict,
            revise_keys=list(revise_keys),
            load=lambda w: self.load_model_state_dict(w, strict=False),
        )

    def resume(
        self,
        path: str | Path,
        *,
        optim_wrapper: Any = None,
        param_schedulers: Any = None,
        resume_optimizer: bool = True,
        resume_param_scheduler: bool = True,
        map_location: Any = "cpu",
        callback: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Restore the prepared model, ``optim_wrapper`` and ``param_schedulers`` from the trainwright checkpoint at
        ``path``; return the checkpoint.

        The checkpoint's other pieces (``progress``, ``train_dataloader``...) are returned for the
        caller; a Trainer restores them all itself (``resume=``).

        Raises:
            KeyError: the checkpoint lacks a piece asked for (``model``; ``optim_wrapper`` / ``param_schedulers``
                when given and ``resume_*`` is True), named with the fix.
            ValueError: it holds another number of schedulers than given.
        """
        ckpt = self.load_checkpoint(path, map_location)
        if callback is not None:
            callback(ckpt)
        wanted = (
            ["model"]
            + ["optim_wrapper"] * (resume_optimizer and optim_wrapper is not None)
            + ["param_schedulers"] * (resume_param_scheduler and bool(param_schedulers))
        )
        missing = [k for k in wanted if k not in ckpt]
        if missing:
            raise KeyError(
                f"Checkpoint {str(path)!r} has no {missing} (it holds {sorted(ckpt)}): resume from a trainwright "
                "training checkpoint, "
                "or load weights only with load_checkpoint_weights / load_or_resume(load_from=...)"
            )
        self.load_model_state_dict(ckpt["model"], strict=True)
        if "optim_wrapper" in wanted:
            self.load_optim_state_dict(optim_wrapper, ckpt["optim_wrapper"])
        if "param_schedulers" in wanted:
            for scheduler, state in _pairs(param_schedulers, ckpt["param_schedulers"]):
                scheduler.load_state_dict(state)
        return ckpt

    def load_or_resume(
        self,
        *,
        load_from: str | Path | None = None,
        resume: bool | str | Path = False,
        ckpt_dir: str | Path | None = None,
        optim_wrapper: Any = None,
        param_schedulers: Any = None,
    ) -> dict[str, Any] | None:
        """``resume`` (a path, or True: the newest checkpoint of ``ckpt_dir`` that loads) if set, else the weights of
        ``load_from``; None when neither applies.

        Raises:
            ValueError: ``resume=True`` without ``ckpt_dir``.
        """
        if resume:
            if resume is True:
                if ckpt_dir is None:
                    raise ValueError(
                        "load_or_resume(resume=True) needs ckpt_dir=, the folder whose newest checkpoint is resumed"
                    )
                found = self.find_resumable(ckpt_dir)
                if found is None:
                    return None if load_from is None else self._load_only(load_from)
                resume = str(found[0])
            return self.resume(resume, optim_wrapper=optim_wrapper, param_schedulers=param_schedulers)
        return None if load_from is None else self._load_only(load_from)

    def _load_only(self, path: str | Path) -> dict[str, Any]:
        ckpt: dict[str, Any] = {}
        self.load_checkpoint_weights(path, callback=ckpt.update)
        return ckpt


def _pairs(schedulers: Any, states: Any) -> list[tuple[Any, Any]]:
    """``(scheduler, saved state)`` of a list (or a dict of lists per optim wrapper) and its saved states."""
    if isinstance(schedulers, Mapping):
        return [
            pair
            for name, group in schedulers.items()
            for pair in _pairs(group, states.get(name, []) if isinstance(states, Mapping) else [])
        ]
    if len(states) != len(schedulers):
        raise ValueError(
            f"The checkpoint holds {len(states)} param scheduler(s), {len(schedulers)} were given; build the same "
            "param_scheduler config"
        )
    return list(zip(schedulers, states))


__all__ = ["StrategyParts"]
