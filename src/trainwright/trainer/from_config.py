"""``Trainer.from_config``: a trainer from a config mapping (a :class:`~trainwright.config.Config` or a dict).

The model and the datasets are built here through the registries (``MODELS``, ``DATASETS``),
the rest by the Trainer as for any dict argument. A failure becomes a
:class:`~trainwright.registry.ConfigError` naming the config path of the failing key and the
original error. mmengine spellings of the parts trainwright has are accepted (loop types,
``DefaultSampler`` / ``InfiniteSampler``, ``collate_fn=dict(type=...)``); mmengine runtime
keys trainwright has no use for are ignored with a warning.
"""

from __future__ import annotations

import copy
import inspect
import json
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwright.logging.writers import plain
from trainwright.utils.imports import import_modules
from trainwright.registry import DATASETS, FUNCTIONS, MODELS, ConfigError, did_you_mean, dropping_scope, ignored_scope_hint
from trainwright.utils.seed import set_random_seed

if TYPE_CHECKING:
    from trainwright.trainer.trainer import Trainer

#: mmengine runtime keys accepted and ignored (trainwright has no such part, or sets it itself).
IGNORED_KEYS = frozenset({
    "default_scope", "log_processor", "visualizer", "vis_backends", "launcher", "model_wrapper_cfg", "auto_scale_lr", "dist_params",
    "find_unused_parameters", "sync_bn", "data_preprocessor",
})
#: Keys used while loading, not by the trainer.
LOADING_KEYS = frozenset({"custom_imports"})
#: A top-level key this similar to a Trainer argument (difflib's ratio) is a typo of it, refused: 'optim_wraper' (0.96),
#: 'trian_cfg' (0.89), 'val_cgf' (0.86). mmengine's helper variables stay below it: 'gallery_dataloader' (0.81 to
#: 'val_dataloader'), 'train_dataset' (0.76), 'tta_model' (0.71), 'norm_cfg' (0.67), 'optimizer' (0.64) are warned about.
_TYPO = 0.85
_LOADERS = ("train_dataloader", "val_dataloader", "test_dataloader")
_LOOP_TYPES = {"EpochBasedTrainLoop": True, "IterBasedTrainLoop": False}
_EVAL_LOOP_TYPES = {"val_cfg": "ValLoop", "test_cfg": "TestLoop"}
_SAMPLERS = {"DefaultSampler", "InfiniteSampler"}


#: mmengine's visualizer backends -> trainwright writer name and ``{their argument: ours}`` (None: accepted, not needed here).
_VIS_BACKENDS: dict[str, tuple[str, dict[str, str | None]]] = {
    "LocalVisBackend": ("jsonl", {"save_dir": None, "img_save_dir": None, "config_save_file": None, "scalar_save_file": None}),
    "TensorboardVisBackend": ("tensorboard", {"save_dir": None}),
    "WandbVisBackend": ("wandb", {"save_dir": None, "init_kwargs": "init_kwargs"}),
    "MLflowVisBackend": ("mlflow", {"save_dir": None, "exp_name": "experiment_name", "run_name": "run_name", "tags": "tags", "tracking_uri": "tracking_uri"}),
}
#: Runtime keys of mmengine that are translated (not ignored) when they hold something.
_TRANSLATED = frozenset({"visualizer", "vis_backends", "auto_scale_lr", "model_wrapper_cfg", "log_processor", "find_unused_parameters", "sync_bn", "data_preprocessor"})
#: mmengine's DDP wrapper names in ``model_wrapper_cfg``, and the arguments the DDP strategy takes from it.
_DDP_WRAPPERS = frozenset({"MMDistributedDataParallel", "DistributedDataParallelWrapper"})
_DDP_WRAPPER_KEYS = frozenset({"find_unused_parameters", "broadcast_buffers", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "detect_anomalous_params"})


_LOG_PROCESSOR_KEYS = {"type", "window_size", "by_epoch", "custom_cfg", "num_digits", "log_with_hierarchy", "mean_pattern", "_scope_"}


def _logger_from_log_processor(args: dict[str, Any]) -> None:
    """mmengine's ``log_processor=dict(window_size=..., by_epoch=..., custom_cfg=[...])`` as the logger hook's arguments.

    ``window_size`` and ``custom_cfg`` become ``default_hooks.logger``'s (a value the config
    gives the logger itself wins); ``by_epoch`` must agree with ``train_cfg.by_epoch`` (the
    lines follow the loop: a warning otherwise); ``num_digits``, ``log_with_hierarchy`` and
    ``mean_pattern`` are formatting trainwright does not have (a warning names them).
    """
    lp = args.get("log_processor")
    if lp is None:
        return
    if not isinstance(lp, Mapping):
        raise ConfigError(f"log_processor must be a dict (mmengine's LogProcessor arguments), got {type(lp).__name__}")
    bad = set(lp) - _LOG_PROCESSOR_KEYS
    if bad:
        raise ConfigError(f"log_processor: unknown keys {sorted(bad)}; mmengine's LogProcessor takes {sorted(_LOG_PROCESSOR_KEYS - {'_scope_'})}")
    if lp.get("type", "LogProcessor") != "LogProcessor":
        raise ConfigError(f"log_processor type {lp.get('type')!r}: only mmengine's 'LogProcessor' is understood (its window_size, custom_cfg, by_epoch)")
    hooks = dict(args.get("default_hooks") or {})
    if "logger" in hooks and hooks["logger"] is None:
        return  # the logger is switched off: nothing to configure
    logger = dict(hooks.get("logger") or {})
    for key in ("window_size", "custom_cfg"):
        if lp.get(key) is not None:
            logger.setdefault(key, [dict(c) for c in lp[key]] if key == "custom_cfg" else lp[key])
    hooks["logger"] = logger
    args["default_hooks"] = hooks
    train_cfg = args.get("train_cfg") or {}
    loop_by_epoch = True
    if isinstance(train_cfg, Mapping):  # mmengine's loop type says it too (translated later, with the rest of train_cfg)
        loop_by_epoch = train_cfg.get("by_epoch", _LOOP_TYPES.get(str(train_cfg.get("type")), True))
    if "by_epoch" in lp and bool(lp["by_epoch"]) != bool(loop_by_epoch):
        warnings.warn(f"log_processor.by_epoch={lp['by_epoch']} but train_cfg.by_epoch={loop_by_epoch}: the log lines follow the training loop", stacklevel=3)
    unused = sorted(k for k in ("num_digits", "log_with_hierarchy", "mean_pattern") if k in lp)
    if unused:
        warnings.warn(f"log_processor {unused}: formatting trainwright's writers do not have; ignored", stacklevel=3)


def _writers_from_visualizer(args: Mapping[str, Any]) -> list[Any] | None:
    """mmengine's ``visualizer=dict(vis_backends=[...])`` (or a top-level ``vis_backends``) as ``writers``; None when there is none.

    The console writer is always kept (mmengine's logger prints every line). Arguments trainwright
    does not need (``save_dir``: files go into the run folder) are accepted; others are refused
    by name. A config that also sets ``writers`` keeps its ``writers``, with a warning.
    """
    visualizer = args.get("visualizer")
    backends = visualizer.get("vis_backends") if isinstance(visualizer, Mapping) else None
    if backends is None:
        backends = args.get("vis_backends")
    if backends is None:
        return None
    if args.get("writers") is not None:
        warnings.warn("The config sets both writers and visualizer.vis_backends; writers wins and vis_backends is ignored", stacklevel=3)
        return None
    if isinstance(backends, Mapping):
        backends = [backends]
    writers: list[Any] = ["console"]
    for i, backend in enumerate(backends):
        where = f"visualizer.vis_backends[{i}]"
        kind = backend.get("type") if isinstance(backend, Mapping) else None
        if kind not in _VIS_BACKENDS:
            raise ConfigError(
                f"{where}: {kind!r} is not a visualizer backend trainwright maps to a writer.{did_you_mean(str(kind), list(_VIS_BACKENDS))} "
                f"Use one of {list(_VIS_BACKENDS)}, or give writers=[...] (trainwright.logging.WRITERS) instead of a visualizer"
            )
        name, known = _VIS_BACKENDS[kind]
        unknown = sorted(k for k in backend if k not in known and k not in ("type", "_scope_"))
        if unknown:
            raise ConfigError(f"{where} ({kind}): trainwright's {name!r} writer has no counterpart of {unknown}; drop them (it takes {sorted(known)})")
        mapped = {ours: backend[theirs] for theirs, ours in known.items() if ours is not None and theirs in backend}
        item: Any = dict(type=name, **mapped) if mapped else name
        if item not in writers:
            writers.append(item)
    return writers


def _data_preprocessor(cfg: Any, kwargs: dict[str, Any]) -> None:
    """mmengine's top-level ``data_preprocessor``: the model dict's unless it names its own (``model.setdefault``, as mmengine's Runner)."""
    if cfg is None:
        return
    model = kwargs["model"]
    if isinstance(model, Mapping):
        kwargs["model"] = {**model, "data_preprocessor": model.get("data_preprocessor", cfg)}
    else:
        warnings.warn(f"data_preprocessor at top level is not applied: the model is a built {type(model).__name__}, not a dict(type=...) "
                      "it could be passed to (give the model its data_preprocessor yourself)", stacklevel=3)


def _model_wrapper(cfg: Any, kwargs: dict[str, Any]) -> None:
    """mmengine's ``model_wrapper_cfg=dict(type='MMDistributedDataParallel', find_unused_parameters=..., ...)``: the DDP strategy's arguments.

    Applied when the run is DDP (``strategy='ddp'``, or ``'auto'`` under a launcher with several
    processes); on one process there is no wrapper, as in mmengine. Other wrapper types are refused.
    """
    if not cfg:
        return
    from trainwright.dist import launched_world_size

    wrapper = dict(cfg)
    typ = wrapper.pop("type", "MMDistributedDataParallel")
    if typ not in _DDP_WRAPPERS:
        raise ConfigError(f"model_wrapper_cfg type={typ!r} is not supported: trainwright's DDP wrapper answers to {sorted(_DDP_WRAPPERS)}; "
                          "for sharding use strategy=dict(type='fsdp', ...) instead of an FSDP model wrapper")
    unknown = sorted(set(wrapper) - _DDP_WRAPPER_KEYS)
    if unknown:
        raise ConfigError(f"model_wrapper_cfg keys {unknown} are not supported; allowed: {sorted(_DDP_WRAPPER_KEYS)}")
    strategy = kwargs.get("strategy", "auto")
    name = strategy.get("type") if isinstance(strategy, Mapping) else strategy
    if name == "ddp" or (name in (None, "auto") and launched_world_size() > 1):
        kwargs["strategy"] = {**wrapper, **(dict(strategy) if isinstance(strategy, Mapping) else {}), "type": "ddp"}


def _auto_scale_lr(cfg: Any, kwargs: dict[str, Any]) -> str | None:
    """mmengine's ``auto_scale_lr=dict(enable=True, base_batch_size=N)``: scale the optimizer's ``lr`` by the real batch size / N.

    The real batch size is ``train_dataloader.batch_size`` times the number of data shards: the
    processes the launcher started (mmengine's ``_scale_lr``), divided by the tensor-parallel
    size when the strategy has one (its ranks share batches); per-group multipliers
    (``paramwise_cfg``) follow. Returns the line to log, or None when nothing was scaled.
    """
    if not isinstance(cfg, Mapping) or not cfg.get("enable", False):
        return None
    from trainwright.dist import launched_world_size

    base = cfg.get("base_batch_size")
    if not isinstance(base, int) or isinstance(base, bool) or base <= 0:
        raise ConfigError(f"auto_scale_lr.base_batch_size must be a positive int (the batch size the lr was tuned for), got {base!r}")
    loader = kwargs.get("train_dataloader")
    batch = loader.get("batch_size") if isinstance(loader, Mapping) else getattr(loader, "batch_size", None)
    optim = kwargs.get("optim_wrapper")
    optimizer = optim.get("optimizer") if isinstance(optim, Mapping) else None
    if not isinstance(batch, int) or not isinstance(optimizer, Mapping) or not isinstance(optimizer.get("lr"), (int, float)):
        raise ConfigError(
            "auto_scale_lr=dict(enable=True) needs train_dataloader.batch_size and optim_wrapper.optimizer.lr in the config "
            f"(got batch_size={batch!r}, lr={optimizer.get('lr') if isinstance(optimizer, Mapping) else None!r}); set them, or enable=False"
        )
    strategy = kwargs.get("strategy")
    tp = strategy.get("tensor_parallel") if isinstance(strategy, Mapping) else None
    tp_size = tp.get("size", 1) if isinstance(tp, Mapping) else 1
    shards = max(1, launched_world_size() // tp_size) if isinstance(tp_size, int) and tp_size > 0 else launched_world_size()
    ratio = batch * shards / base
    kwargs["optim_wrapper"] = {**optim, "optimizer": {**optimizer, "lr": optimizer["lr"] * ratio}}  # type: ignore[dict-item]
    return f"auto_scale_lr: lr {optimizer['lr']} -> {optimizer['lr'] * ratio:g} (batch size {batch} x {shards} data shard(s) / base_batch_size {base})"


def _collate_fn(loader: str, cfg: Mapping[str, Any]) -> Any:
    """``collate_fn=dict(type=name, **kwargs)``: the function registered in ``FUNCTIONS`` with the kwargs bound (mmengine's)."""
    import functools

    import trainwright.data.collate  # noqa: F401  (registers pseudo_collate / default_collate)

    cfg = {k: v for k, v in cfg.items() if k != "_scope_"}
    if "type" not in cfg:
        raise ConfigError(f"{loader}.collate_fn needs a 'type' (a function name such as 'pseudo_collate' or 'default_collate'), got {cfg}")
    kind = cfg.pop("type")
    try:
        fn = kind if callable(kind) else FUNCTIONS.get(kind)
    except KeyError as e:
        raise ConfigError(f"{loader}.collate_fn: {e.args[0]}") from None
    return functools.partial(fn, **cfg) if cfg else fn


def trainer_keys(trainer_cls: type) -> list[str]:
    """The top-level keys a config may set: the Trainer's constructor arguments."""
    return list(inspect.signature(trainer_cls).parameters)


def trainer_from_config(trainer_cls: type[Trainer], cfg: Mapping[str, Any], **overrides: Any) -> Trainer:
    """Build ``trainer_cls`` from ``cfg`` (see :meth:`Trainer.from_config`)."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"Trainer.from_config needs a Config or a dict, got {type(cfg).__name__}; load files with trainwright.config.Config.fromfile(path)")
    args = dict(cfg)
    args.update(overrides)
    filename = getattr(cfg, "filename", None)
    import_modules(args.get("custom_imports"), Path(filename) if filename else None)  # Config.fromfile has usually done it already
    allowed = trainer_keys(trainer_cls)
    writers = _writers_from_visualizer(args)
    if writers is not None:
        args["writers"] = writers
    _logger_from_log_processor(args)
    ignored = sorted(k for k in args if k in IGNORED_KEYS and args[k] is not None and k not in _TRANSLATED)
    if ignored:
        warnings.warn(f"Config keys {ignored} are mmengine runtime settings trainwright does not use; they are ignored", stacklevel=2)
    helpers = []
    for key in args:
        if key not in allowed and key not in IGNORED_KEYS and key not in LOADING_KEYS and not key.startswith("_"):
            hint = did_you_mean(key, allowed, cutoff=_TYPO)
            if hint:  # a typo of a Trainer argument: refusing it beats training without it
                raise ConfigError(f"Unknown top-level config key {key!r}.{hint} The keys are the Trainer's arguments: {allowed}.")
            helpers.append(key)
    if helpers:  # mmengine configs keep helper variables at top level (data_root = ..., norm_cfg = ..., optimizer = ...)
        hints = "".join(f" {key!r}:{hint}" for key in sorted(helpers) if (hint := did_you_mean(key, allowed)))
        warnings.warn(
            f"Config keys {sorted(helpers)} are not Trainer arguments: taken as helper variables of the config and not used by the "
            f"trainer (name them with a leading underscore to silence this).{' If one was meant as an argument:' + hints if hints else ''}",
            stacklevel=2,
        )
    kwargs = {k: v for k, v in args.items() if k in allowed}
    if "model" not in kwargs or kwargs["model"] is None:
        raise ConfigError("The config has no 'model': add model = dict(type='MyModel', ...) (a class registered in trainwright.registry.MODELS)")
    _translate_mmengine(kwargs)
    _data_preprocessor(args.get("data_preprocessor"), kwargs)
    scaled = _auto_scale_lr(args.get("auto_scale_lr"), kwargs)
    wrapper_cfg = args.get("model_wrapper_cfg")
    if wrapper_cfg is None and args.get("find_unused_parameters"):  # mmengine's top-level key, used when no model_wrapper_cfg is given
        wrapper_cfg = dict(find_unused_parameters=True)
    _model_wrapper(wrapper_cfg, kwargs)
    if args.get("sync_bn"):
        warnings.warn(
            f"sync_bn={args['sync_bn']!r}: trainwright does not convert BatchNorm layers to SyncBatchNorm (mmengine does under several "
            "processes), so each process normalises with its own batch's statistics; convert the model yourself "
            "(torch.nn.SyncBatchNorm.convert_sync_batchnorm, CUDA only) or leave sync_bn out",
            stacklevel=2,
        )
    randomness = kwargs.get("randomness") or {}
    if isinstance(randomness, Mapping) and randomness.get("seed") is not None:
        # as mmengine: seed before the model is built, so its initial weights follow the seed too
        set_random_seed(int(randomness["seed"]), deterministic=bool(randomness.get("deterministic", False)))
    index = dict(_mappings(kwargs))
    scope = args.get("default_scope")
    kwargs["model"] = _build(lambda: MODELS.build(kwargs["model"]), index, "model", scope)
    for name in _LOADERS:
        loader = kwargs.get(name)
        if isinstance(loader, Mapping) and isinstance(loader.get("dataset"), Mapping):
            loader = dict(loader)
            loader["dataset"] = _build(lambda: DATASETS.build(loader["dataset"]), index, f"{name}.dataset", scope)  # noqa: B023 - called at once
            kwargs[name] = loader
    trainer = _build(lambda: trainer_cls(**kwargs), index, None, scope)
    if scaled:
        trainer.logger.info(scaled)
    if trainer.is_main_process:
        dump_config(_resolved(cfg, overrides), trainer.run_dir)
    return trainer


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
        path for path, m in index.items()
        if m and all(k in failed and _equal(failed[k], v) for k, v in m.items() if k not in ("priority", "_scope_")) and m.get("type", failed.get("type")) == failed.get("type")
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


def _translate_mmengine(kwargs: dict[str, Any]) -> None:
    """Accept mmengine's spellings of the parts trainwright has, in place."""
    train_cfg = kwargs.get("train_cfg")
    if isinstance(train_cfg, Mapping) and "type" in train_cfg:
        train_cfg = dict(train_cfg)
        typ = train_cfg.pop("type")
        with dropping_scope(train_cfg):  # mmengine builds a typed loop config through its LOOPS registry: _scope_ dropped, as Registry.build does
            if typ not in _LOOP_TYPES:
                raise ConfigError(f"train_cfg.type {typ!r} is not a loop trainwright has.{did_you_mean(str(typ), list(_LOOP_TYPES))} Use {list(_LOOP_TYPES)} or by_epoch=True/False")
        train_cfg.setdefault("by_epoch", _LOOP_TYPES[typ])
        kwargs["train_cfg"] = train_cfg
    for key, loop in _EVAL_LOOP_TYPES.items():
        value = kwargs.get(key)
        if isinstance(value, Mapping) and "type" in value:
            value = dict(value)
            typ = value.pop("type")
            with dropping_scope(value):  # as train_cfg's
                if typ != loop:
                    raise ConfigError(f"{key}.type {typ!r} is not a loop trainwright has; use {loop!r} or leave type out")
            kwargs[key] = value
        if key in ("val_cfg", "test_cfg") and isinstance(kwargs.get(key), Mapping):
            kwargs[key] = {k: v for k, v in kwargs[key].items() if k != "fp16"} | ({"autocast": True} if kwargs[key].get("fp16") else {})
    for name in _LOADERS:
        loader = kwargs.get(name)
        if not isinstance(loader, Mapping):
            continue
        loader = dict(loader)
        sampler = loader.get("sampler")
        mmengine_style = isinstance(sampler, Mapping) and sampler.get("type") in _SAMPLERS
        if mmengine_style:
            loader.pop("sampler")
            loader.setdefault("shuffle", bool(sampler.get("shuffle", True)))  # type: ignore[union-attr]
            if sampler.get("seed") is not None:  # type: ignore[union-attr]
                warnings.warn(
                    f"{name}.sampler seed={sampler['seed']!r} is not used: the data order follows the run's seed (randomness=dict(seed=...)), "  # type: ignore[index]
                    "so a resumed run keeps it; set randomness=dict(seed=...) to choose it",
                    stacklevel=3,
                )
        # mmengine's Runner collates with pseudo_collate unless the config names another function
        collate = loader.get("collate_fn", dict(type="pseudo_collate") if mmengine_style else None)
        if isinstance(collate, Mapping):
            loader["collate_fn"] = _collate_fn(name, collate)
        if not loader.get("num_workers"):
            loader.pop("persistent_workers", None)  # torch refuses persistent_workers without workers
        kwargs[name] = loader
