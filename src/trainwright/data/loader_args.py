"""mmengine's dataloader dict spellings as ``DataLoader`` arguments: ``sampler=dict(type=...)`` and
``collate_fn=dict(type=...)``.

Every loader given as a dict goes through :func:`dataloader_arguments` (from a config, from
``Trainer(train_dataloader=dict(...))`` in Python, from ``Runner``), so a sampler dict never
reaches torch's ``DataLoader`` as it is: there its keys would be taken as dataset indices.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

from trainwright.registry import FUNCTIONS, ConfigError


class DefaultSampler:
    """mmengine's ``DefaultSampler`` as the ``type`` of a loader dict: ``sampler=dict(type=DefaultSampler,
    shuffle=True)``.

    mmengine's Python-style configs name the class instead of the string; either way the
    Trainer builds the sampler (sharded over the processes, resumable, ``DefaultSampler``'s
    order from the run's seed). Built directly it would not know the processes, so it is refused.

    Raises:
        TypeError: always, when called: give it as a loader dict's sampler ``type``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            f"{type(self).__name__} is not built directly in trainwright: give it as a dataloader dict's sampler, "
            f"sampler=dict(type={type(self).__name__}, shuffle=True), and the Trainer builds a sharded, resumable "
            "sampler"
        )


class InfiniteSampler(DefaultSampler):
    """mmengine's ``InfiniteSampler`` as the ``type`` of a loader dict (``shuffle=...``: iteration-based loops
    restart epochs themselves)."""


#: mmengine's sampler types a loader dict may name (by name, or these classes): each becomes ``shuffle=...``.
SAMPLER_TYPES = frozenset({"DefaultSampler", "InfiniteSampler"})


def _is_epoch_sampler(sampler: Any) -> bool:
    kind = sampler.get("type") if isinstance(sampler, Mapping) else None
    if isinstance(kind, type):
        return issubclass(kind, DefaultSampler)
    return (
        isinstance(kind, str) and kind.rpartition(".")[2] in SAMPLER_TYPES
    )  # "mmengine.DefaultSampler": the scope is dropped, as a registry does


def collate_function(cfg: Mapping[str, Any], name: str = "dataloader") -> Any:
    """``collate_fn=dict(type=name, **kwargs)``: the function registered in ``FUNCTIONS`` (or given) with the kwargs
    bound."""
    import trainwright.data.collate  # noqa: F401  (registers pseudo_collate / default_collate)

    args = {k: v for k, v in cfg.items() if k != "_scope_"}
    if "type" not in args:
        raise ConfigError(
            f"{name}.collate_fn needs a 'type' (a function name such as 'pseudo_collate' or 'default_collate'), got "
            f"{dict(cfg)}"
        )
    kind = args.pop("type")
    try:
        fn = kind if callable(kind) else FUNCTIONS.get(kind)
    except KeyError as e:
        raise ConfigError(f"{name}.collate_fn: {e.args[0]}") from None
    return functools.partial(fn, **args) if args else fn


def dataloader_arguments(cfg: Mapping[str, Any], name: str = "dataloader") -> dict[str, Any]:
    """The ``DataLoader`` keyword arguments of a loader dict, with mmengine's sampler and collate dicts translated.

    - ``sampler=dict(type='DefaultSampler', shuffle=..., seed=...)`` / ``'InfiniteSampler'`` (or
      the classes :class:`DefaultSampler` / :class:`InfiniteSampler`, as mmengine's Python-style
      configs write them) become ``shuffle=...``: trainwright's
      :class:`~trainwright.data.loader.EpochSampler` then draws mmengine's ``DefaultSampler`` order
      (``torch.randperm`` under ``seed + epoch``, padded and strided per rank) from the run's seed.
    - A loader written that way collates with ``pseudo_collate`` unless it names a
      ``collate_fn``, as mmengine's Runner does.
    - ``collate_fn=dict(type=name, **kwargs)``: the function of ``trainwright.registry.FUNCTIONS``
      with the keyword arguments bound.

    Raises:
        ConfigError: a sampler dict of another type (its keys would reach the dataset as
            indices), or a ``collate_fn`` dict without a known ``type``; each names the fix.
    """
    args = dict(cfg)
    sampler = args.get("sampler")
    mmengine_style = _is_epoch_sampler(sampler)
    if mmengine_style:
        assert isinstance(sampler, Mapping)
        args.pop("sampler")
        unknown = sorted(set(sampler) - {"type", "shuffle", "seed", "round_up", "_scope_"})
        if unknown:
            raise ConfigError(
                f"{name}.sampler: {unknown} are not arguments of mmengine's DefaultSampler / InfiniteSampler (shuffle, "
                "seed, round_up)"
            )
        if "shuffle" in args and bool(args["shuffle"]) != bool(sampler.get("shuffle", True)):
            raise ConfigError(
                f"{name} gives shuffle={args['shuffle']} and sampler shuffle={sampler.get('shuffle', True)}: give one "
                "of them"
            )
        args["shuffle"] = bool(sampler.get("shuffle", True))
        if sampler.get("seed") is not None:
            warnings.warn(
                f"{name}.sampler seed={sampler['seed']!r} is not used: the data order follows the run's seed "
                "(randomness=dict(seed=...)), "
                "so a resumed run keeps it; set randomness=dict(seed=...) to choose it",
                stacklevel=3,
            )
    elif isinstance(sampler, Mapping):
        raise ConfigError(
            f"{name}.sampler={dict(sampler)!r}: a sampler dict must name mmengine's 'DefaultSampler' or "
            "'InfiniteSampler' (they become "
            "shuffle=True/False, sharded and resumable by trainwright); for another sampler pass the built object "
            "(sampler=MySampler(dataset)), "
            "or use shuffle=True/False. torch's DataLoader would take the dict's keys as dataset indices."
        )
    # mmengine's Runner collates with pseudo_collate unless the loader names another function
    collate = args.get("collate_fn", dict(type="pseudo_collate") if mmengine_style else None)
    if isinstance(collate, Mapping):
        args["collate_fn"] = collate_function(collate, name)
    if not args.get("num_workers"):
        args.pop("persistent_workers", None)  # torch refuses persistent_workers without workers
    return args


__all__ = ["DefaultSampler", "InfiniteSampler", "SAMPLER_TYPES", "collate_function", "dataloader_arguments"]


def carried_arguments(loader: Any, generator: Any) -> dict[str, Any]:
    """The arguments that carry ``loader``'s collate function, worker, pinning and ordering settings over to a loader
    built again over the same data, with ``generator`` giving the iterator its base seed (the workers' seeds).

    Batching (``batch_size`` / ``batch_sampler``) is the caller's: it is what a rebuild changes.
    """
    kwargs: dict[str, Any] = dict(
        collate_fn=loader.collate_fn,
        num_workers=loader.num_workers,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=generator,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=getattr(loader, "pin_memory_device", ""),
    )
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return kwargs
