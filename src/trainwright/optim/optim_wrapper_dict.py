"""OptimWrapperDict: several optimizers (GANs), one wrapper per name."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

from torch import nn

from trainwright.optim.optim_wrapper import OptimWrapper
from trainwright.registry import OPTIM_WRAPPERS, did_you_mean


@OPTIM_WRAPPERS.register
class OptimWrapperDict:
    """A name → :class:`OptimWrapper` mapping; the model's ``train_step`` steps each by name.

    Read-outs (``get_lr``, ``get_momentum``) are prefixed by name; ``param_groups`` and
    ``state_dict`` are keyed by name. ``update_params``, ``backward``, ``step`` and
    ``optim_context`` raise ``NotImplementedError`` (as in mmengine): which optimizer steps
    when, on which loss, is the model's decision (``optim_wrapper["generator"].update_params(loss_g)``).
    ``zero_grad`` and ``initialize_count_status`` reach every wrapper.
    """

    def __init__(self, **optim_wrappers: OptimWrapper) -> None:
        for name, ow in optim_wrappers.items():
            if not isinstance(ow, OptimWrapper):
                raise TypeError(f"OptimWrapperDict values must be OptimWrapper, got {type(ow).__name__} for {name!r}")
        self.optim_wrappers = dict(optim_wrappers)

    def __getitem__(self, name: str) -> OptimWrapper:
        if name not in self.optim_wrappers:
            names = list(self.optim_wrappers)
            starting = [n for n in names if str(n).startswith(str(name))]
            hint = f" Did you mean {starting[0]!r}?" if len(starting) == 1 else did_you_mean(str(name), names)
            raise KeyError(f"No optim wrapper named {name!r}; the wrappers are {names}.{hint}")
        return self.optim_wrappers[name]

    def __contains__(self, name: str) -> bool:
        return name in self.optim_wrappers

    def __iter__(self) -> Iterator[str]:
        return iter(self.optim_wrappers)

    def __len__(self) -> int:
        return len(self.optim_wrappers)

    def keys(self):  # noqa: D102
        return self.optim_wrappers.keys()

    def values(self):  # noqa: D102
        return self.optim_wrappers.values()

    def items(self):  # noqa: D102
        return self.optim_wrappers.items()

    @property
    def param_groups(self) -> dict[str, list[dict[str, Any]]]:
        """``{name: that wrapper's param_groups}`` (mmengine's layout)."""
        return {n: ow.param_groups for n, ow in self.optim_wrappers.items()}

    def get_lr(self) -> dict[str, list[float]]:
        """``{"<name>.lr": [...]}`` for each wrapper (and ``"<name>.base_lr"`` for one that reports a base lr)."""
        out: dict[str, list[float]] = {}
        for n, ow in self.optim_wrappers.items():
            for key, values in ow.get_lr().items():
                out[f"{n}.{key}"] = values
        return out

    def get_momentum(self) -> dict[str, list[float]]:
        """``{"<name>.momentum": [...]}`` for each wrapper."""
        return {f"{n}.momentum": ow.get_momentum()["momentum"] for n, ow in self.optim_wrappers.items()}

    @property
    def grad_norm(self) -> None:
        """Not aggregated across wrappers; read ``optim_wrapper[name].grad_norm``."""
        return None

    @property
    def loss_scale(self) -> None:
        """Not aggregated across wrappers; read ``optim_wrapper[name].loss_scale``."""
        return None

    def initialize_count_status(self, model: nn.Module | None, init_counts: int, max_counts: int) -> None:
        """Forward to every wrapper."""
        for ow in self.optim_wrappers.values():
            ow.initialize_count_status(model, init_counts, max_counts)

    def _per_wrapper(self, method: str) -> NoReturn:
        raise NotImplementedError(
            f"OptimWrapperDict.{method}: with several optimizers, call it on the one you mean, e.g. "
            f"optim_wrapper[{next(iter(self.optim_wrappers), 'name')!r}].{method}(...) "
            f"(names: {list(self.optim_wrappers)}); each has its own loss, accumulation window and loss scaler"
        )

    def optim_context(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Not meaningful for several optimizers: use ``optim_wrapper[name].optim_context``."""
        self._per_wrapper("optim_context")

    def update_params(
        self, loss: Any, step_kwargs: dict | None = None, zero_kwargs: dict | None = None, num_items: Any = None
    ) -> None:
        """Not meaningful for several optimizers (which one, on which loss?): use
        ``optim_wrapper[name].update_params``."""
        self._per_wrapper("update_params")

    def backward(self, loss: Any, **kwargs: Any) -> None:
        """Not meaningful for several optimizers (each has its own loss scaler): use
        ``optim_wrapper[name].backward``."""
        self._per_wrapper("backward")

    def step(self, **kwargs: Any) -> None:
        """Not meaningful for several optimizers: use ``optim_wrapper[name].step``."""
        self._per_wrapper("step")

    def zero_grad(self, **kwargs: Any) -> None:
        """Zero every wrapper's gradients."""
        for ow in self.optim_wrappers.values():
            ow.zero_grad(**kwargs)

    def state_dict(self) -> dict[str, Any]:
        """``{name: wrapper.state_dict()}``."""
        return {n: ow.state_dict() for n, ow in self.optim_wrappers.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore each wrapper by name."""
        missing = set(self.optim_wrappers) - set(state)
        if missing:
            raise KeyError(f"Checkpoint lacks optim wrapper state for {sorted(missing)}")
        for n, ow in self.optim_wrappers.items():
            ow.load_state_dict(state[n])

    def __repr__(self) -> str:
        return f"OptimWrapperDict({', '.join(f'{n}={ow!r}' for n, ow in self.optim_wrappers.items())})"


def optim_wrappers_of(optim_wrapper: OptimWrapper | OptimWrapperDict | None) -> dict[str, OptimWrapper]:
    """``{name: wrapper}`` of an OptimWrapperDict, ``{"": wrapper}`` of a single wrapper, ``{}`` of None: the one
    walk over a run's wrappers."""
    if optim_wrapper is None:
        return {}
    if isinstance(optim_wrapper, OptimWrapperDict):
        return dict(optim_wrapper.optim_wrappers)
    return {"": optim_wrapper}
