"""trainwright: a PyTorch training engine.

Quick start::

    import trainwright as tw
    trainer = tw.Trainer(model=net, train_dataloader=loader, optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
                         train_cfg=dict(by_epoch=True, max_epochs=10))
    trainer.train()
"""

import importlib as _importlib
import importlib.util as _importlib_util
import typing as _typing

from trainwright.version import __version__

if _typing.TYPE_CHECKING:
    from trainwright import evaluation
    from trainwright.hooks import Hook
    from trainwright.model import BaseModel
    from trainwright.optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict
    from trainwright.trainer import Trainer
    from trainwright.utils.seed import set_random_seed as seed_everything

# Loaded on first use (PEP 562), so that `import trainwright` and the `trainwright` command
# (`--help`, `env`) do not pay for torch and the whole engine before they need it:
# public name -> (module, attribute in it; None: the module itself).
_LAZY: dict[str, tuple[str, str | None]] = {
    "Trainer": ("trainwright.trainer", "Trainer"),
    "BaseModel": ("trainwright.model", "BaseModel"),
    "Hook": ("trainwright.hooks", "Hook"),
    "OptimWrapper": ("trainwright.optim", "OptimWrapper"),
    "AmpOptimWrapper": ("trainwright.optim", "AmpOptimWrapper"),
    "OptimWrapperDict": ("trainwright.optim", "OptimWrapperDict"),
    "evaluation": ("trainwright.evaluation", None),
    "seed_everything": ("trainwright.utils.seed", "set_random_seed"),
}


def __getattr__(name: str) -> _typing.Any:
    """Import a public name (or a subpackage: ``trainwright.hooks``) the first time it is asked for."""
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = _importlib.import_module(module) if attr is None else getattr(_importlib.import_module(module), attr)
    elif not name.startswith("_") and _importlib_util.find_spec(f"{__name__}.{name}") is not None:
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*(n for n in globals() if not n.startswith("_") or n.startswith("__")), *_LAZY})


__all__ = [
    "Trainer",
    "BaseModel",
    "Hook",
    "OptimWrapper",
    "AmpOptimWrapper",
    "OptimWrapperDict",
    "evaluation",
    "seed_everything",
    "__version__",
]
