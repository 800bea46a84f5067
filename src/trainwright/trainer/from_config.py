"""``Trainer.from_config``: a trainer from a config mapping (a :class:`~trainwright.config.Config` or a dict).

The model and the datasets are built here through the registries (``MODELS``, ``DATASETS``),
the rest by the Trainer as for any dict argument. A failure becomes a
:class:`~trainwright.registry.ConfigError` naming the config path of the failing key and the
original error. mmengine's spellings and runtime keys are translated by
:mod:`trainwright.trainer.mmengine_cfg`.
"""

from __future__ import annotations

import copy
import inspect
import json
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from trainwright.logging.writers import plain
from trainwright.registry import DATASETS, MODELS, TYPO_CUTOFF, ConfigError, did_you_mean, ignored_scope_hint
from trainwright.trainer.mmengine_cfg import IGNORED_KEYS, LOADERS, translate_runtime_keys, translate_to_trainer
from trainwright.utils.imports import import_modules
from trainwright.utils.seed import set_random_seed

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer

#: Keys used while loading, not by the trainer.
LOADING_KEYS = frozenset({"custom_imports"})


def trainer_keys(trainer_cls: type) -> list[str]:
    """The top-level keys a config may set: the Trainer's constructor arguments."""
    return list(inspect.signature(trainer_cls).parameters)


def trainer_from_config(trainer_cls: type[Trainer], cfg: Mapping[str, Any], **overrides: Any) -> Trainer:
    """Build ``trainer_cls`` from ``cfg`` (``Trainer.from_config``): a :class:`~trainwright.config.Config`
    (``Config.fromfile(path)``) or a dict.

    The keys are the Trainer's arguments; ``model`` and the dataloaders' ``dataset``
    may be ``dict(type=...)`` of the ``MODELS`` / ``DATASETS`` registries. mmengine configs
    of the parts trainwright has load unchanged (see ``docs/config.md``). The resolved
    config is written into the run folder (``config.py``).

    Args:
        trainer_cls: The Trainer class.
        cfg: The config.
        overrides: Keys that replace the config's (``work_dir=...``, ``experiment_name=...``).

    Raises:
        ConfigError: an unknown top-level key (with close matches), or a part that does not
            build; the message names its config path (``model.backbone``) and the original error.
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError(
            f"Trainer.from_config needs a Config or a dict, got {type(cfg).__name__}; load files with "
            "trainwright.config.Config.fromfile(path)"
        )
    args = dict(cfg)
    args.update(overrides)
    filename = getattr(cfg, "filename", None)
    import_modules(
        args.get("custom_imports"), Path(filename) if filename else None
    )  # Config.fromfile has usually done it already
    built = trainer_arguments(args, trainer_keys(trainer_cls))
    trainer = _build(lambda: trainer_cls(**built.kwargs), built.paths, None, built.scope)
    if built.scaled:
        trainer.logger.info(built.scaled)
    if trainer.strategy.is_main_process:
        dump_config(_resolved(cfg, overrides), trainer.run_dir)
    return trainer


class TrainerArguments(NamedTuple):
    """A config as the Trainer's keyword arguments (:func:`trainer_arguments`)."""

    #: The Trainer's keyword arguments: the model built, the loaders' datasets built, mmengine's keys translated.
    kwargs: dict[str, Any]
    #: The line to log about ``auto_scale_lr`` (None: nothing was scaled).
    scaled: str | None
    #: Every mapping of the config by its dotted path (a failing build names its key).
    paths: dict[str, Mapping[str, Any]]
    #: The config's ``default_scope`` (named when a type is unknown).
    scope: Any


def trainer_arguments(args: dict[str, Any], allowed: list[str]) -> TrainerArguments:
    """Translate a config mapping into the Trainer's keyword arguments (``allowed``: their names), in place of ``args``.

    mmengine's runtime keys and spellings are translated (:mod:`trainwright.trainer.mmengine_cfg`),
    a typo of an argument is refused and other unknown keys are named as helper variables; then,
    after seeding as ``randomness`` says (so the initial weights follow the seed), the model and
    the loaders' ``dataset`` dicts are built through ``MODELS`` / ``DATASETS``. mmengine's
    ``Runner`` (:mod:`trainwright.runner`) gives its keyword arguments the same way.

    Raises:
        ConfigError: a typo of an argument, no ``model``, or a part that does not build (named by its key path).
    """
    translate_runtime_keys(args)
    helpers = []
    for key in args:
        if key not in allowed and key not in IGNORED_KEYS and key not in LOADING_KEYS and not key.startswith("_"):
            hint = did_you_mean(key, allowed, cutoff=TYPO_CUTOFF)
            if hint:  # a typo of a Trainer argument: refusing it beats training without it
                raise ConfigError(
                    f"Unknown top-level config key {key!r}.{hint} The keys are the Trainer's arguments: {allowed}."
                )
            helpers.append(key)
    if (
        helpers
    ):  # mmengine configs keep helper variables at top level (data_root = ..., norm_cfg = ..., optimizer = ...)
        hints = "".join(f" {key!r}:{hint}" for key in sorted(helpers) if (hint := did_you_mean(key, allowed)))
        warnings.warn(
            f"Config keys {sorted(helpers)} are not Trainer arguments: taken as helper variables of the config and not "
            "used by the "
            "trainer (name them with a leading underscore to silence "
            f"this).{' If one was meant as an argument:' + hints if hints else ''}",
            stacklevel=3,
        )
    kwargs = {k: v for k, v in args.items() if k in allowed}
    if "model" not in kwargs or kwargs["model"] is None:
        raise ConfigError(
            "The config has no 'model': add model = dict(type='MyModel', ...) (a class registered in "
            "trainwright.registry.MODELS)"
        )
    scaled = translate_to_trainer(args, kwargs)
    randomness = kwargs.get("randomness") or {}
    if isinstance(randomness, Mapping) and randomness.get("seed") is not None:
        # as mmengine: seed before the model is built, so its initial weights follow the seed too
        set_random_seed(int(randomness["seed"]), deterministic=bool(randomness.get("deterministic", False)))
    index = dict(_mappings(kwargs))
    scope = args.get("default_scope")
    kwargs["model"] = _build(lambda: MODELS.build(kwargs["model"]), index, "model", scope)
    for name in LOADERS:
        loader = kwargs.get(name)
        if isinstance(loader, Mapping) and isinstance(loader.get("dataset"), Mapping):
            loader = dict(loader)
            loader["dataset"] = _build(lambda: DATASETS.build(loader["dataset"]), index, f"{name}.dataset", scope)  # noqa: B023 - called at once
            kwargs[name] = loader
    return TrainerArguments(kwargs, scaled, index, scope)


def _resolved(cfg: Mapping[str, Any], overrides: Mapping[str, Any]) -> Mapping[str, Any]:
    if not overrides:
        return cfg
    try:
        out = copy.deepcopy(cfg)
    except Exception:  # an object in the config that cannot be copied: record the top level
        out = dict(cfg)
    for k, v in overrides.items():
        out[k] = v  # type: ignore[index]
    return out


def dump_config(cfg: Mapping[str, Any], run_dir: Path) -> Path:
    """Write the resolved config into the run folder: ``config.py`` (or the format of the file it came from)."""
    dump = getattr(cfg, "dump", None)
    if callable(dump):
        filename = getattr(cfg, "filename", None)
        suffix = Path(filename).suffix if filename else ".py"
        return Path(dump(run_dir / f"config{suffix}"))
    path = run_dir / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plain(cfg), indent=2) + "\n", encoding="utf-8")
    return path


def config_path_of(cfg: Mapping[str, Any], error: BaseException) -> str | None:
    """The dotted config path (``model.backbone``) of the config dict whose build raised ``error``, if known.

    Registries mark the innermost failing config on the exception (``failed_config``); it is found
    in ``cfg`` by identity, else as the config dict it was made from (same ``type``, its keys included).
    """
    return _find(dict(_mappings(dict(cfg))), getattr(error, "failed_config", None))


def _build(fn: Any, index: dict[str, Mapping[str, Any]], where: str | None, default_scope: Any = None) -> Any:
    try:
        return fn()
    except ConfigError:
        raise
    except Exception as e:
        path = _find(index, getattr(e, "failed_config", None)) or where
        message = f"{type(e).__name__}: {e}" if not isinstance(e, KeyError) else f"{e.args[0] if e.args else e}"
        # ignored like a _scope_ key (which, as in mmengine, comes before default_scope: then it has said so already)
        message += ignored_scope_hint(e, "default_scope", default_scope)
        prefix = f"Building {path!r} from the config failed" if path else "Building the trainer from the config failed"
        raise ConfigError(f"{prefix}: {message}") from e


def _find(index: dict[str, Mapping[str, Any]], failed: Any) -> str | None:
    if not isinstance(failed, Mapping):
        return None
    for path, m in index.items():
        if m is failed:
            return path
    candidates = [
        path
        for path, m in index.items()
        if m
        and all(k in failed and _equal(failed[k], v) for k, v in m.items() if k not in ("priority", "_scope_"))
        and m.get("type", failed.get("type")) == failed.get("type")
    ]
    return max(candidates, key=lambda p: (len(index[p]), p.count("."))) if candidates else None


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _mappings(value: Any, prefix: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every mapping inside ``value`` with its dotted path (list items by index)."""
    if isinstance(value, Mapping):
        if prefix:
            yield prefix, value
        for k, v in value.items():
            yield from _mappings(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _mappings(v, f"{prefix}.{i}")
