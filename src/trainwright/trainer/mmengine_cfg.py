"""mmengine's spellings and runtime keys, translated into the Trainer's arguments (for
:mod:`trainwright.trainer.from_config`).

Loop types, ``fp16`` evaluation, the dataloader dicts (``DefaultSampler`` / ``InfiniteSampler``,
``collate_fn=dict(type=...)``: :mod:`trainwright.data.loader_args`, which every loader dict goes
through); ``visualizer`` / ``vis_backends`` → writers, ``log_processor`` → the logger hook,
``auto_scale_lr``, ``model_wrapper_cfg`` / ``find_unused_parameters`` → the DDP strategy, a
top-level ``data_preprocessor`` → the model's. Runtime keys trainwright has no use for are
ignored with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from trainwright.data.loader_args import dataloader_arguments
from trainwright.registry import ConfigError, did_you_mean, dropping_scope

#: mmengine runtime keys accepted and ignored (trainwright has no such part, or sets it itself).
IGNORED_KEYS = frozenset(
    {
        "default_scope",
        "log_processor",
        "visualizer",
        "vis_backends",
        "launcher",
        "model_wrapper_cfg",
        "auto_scale_lr",
        "dist_params",
        "find_unused_parameters",
        "sync_bn",
        "data_preprocessor",
    }
)
#: The loaders a config may give.
LOADERS = ("train_dataloader", "val_dataloader", "test_dataloader")
_LOOP_TYPES = {"EpochBasedTrainLoop": True, "IterBasedTrainLoop": False}
_EVAL_LOOP_TYPES = {"val_cfg": "ValLoop", "test_cfg": "TestLoop"}


#: mmengine's visualizer backends -> trainwright writer name and ``{their argument: ours}`` (None: accepted, not needed
#: here).
_VIS_BACKENDS: dict[str, tuple[str, dict[str, str | None]]] = {
    "LocalVisBackend": (
        "jsonl",
        {"save_dir": None, "img_save_dir": None, "config_save_file": None, "scalar_save_file": None},
    ),
    "TensorboardVisBackend": ("tensorboard", {"save_dir": None}),
    "WandbVisBackend": ("wandb", {"save_dir": None, "init_kwargs": "init_kwargs"}),
    "MLflowVisBackend": (
        "mlflow",
        {
            "save_dir": None,
            "exp_name": "experiment_name",
            "run_name": "run_name",
            "tags": "tags",
            "tracking_uri": "tracking_uri",
        },
    ),
}
#: Runtime keys of mmengine that are translated (not ignored) when they hold something.
_TRANSLATED = frozenset(
    {
        "visualizer",
        "vis_backends",
        "auto_scale_lr",
        "model_wrapper_cfg",
        "log_processor",
        "find_unused_parameters",
        "sync_bn",
        "data_preprocessor",
    }
)
#: mmengine's DDP wrapper names in ``model_wrapper_cfg``, and the arguments the DDP strategy takes from it.
_DDP_WRAPPERS = frozenset(
    {"MMDistributedDataParallel", "DistributedDataParallelWrapper", "MMSeparateDistributedDataParallel"}
)
_DDP_WRAPPER_KEYS = frozenset(
    {
        "find_unused_parameters",
        "broadcast_buffers",
        "bucket_cap_mb",
        "gradient_as_bucket_view",
        "static_graph",
        "detect_anomalous_params",
    }
)


_LOG_PROCESSOR_KEYS = {
    "type",
    "window_size",
    "by_epoch",
    "custom_cfg",
    "num_digits",
    "log_with_hierarchy",
    "mean_pattern",
    "_scope_",
}


def _logger_from_log_processor(args: dict[str, Any]) -> None:
    """mmengine's ``log_processor=dict(window_size=..., by_epoch=..., custom_cfg=[...])`` as the logger hook's
    arguments.

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
        raise ConfigError(
            f"log_processor: unknown keys {sorted(bad)}; mmengine's LogProcessor takes "
            f"{sorted(_LOG_PROCESSOR_KEYS - {'_scope_'})}"
        )
    if lp.get("type", "LogProcessor") != "LogProcessor":
        raise ConfigError(
            f"log_processor type {lp.get('type')!r}: only mmengine's 'LogProcessor' is understood (its window_size, "
            "custom_cfg, by_epoch)"
        )
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
    if isinstance(
        train_cfg, Mapping
    ):  # mmengine's loop type says it too (translated later, with the rest of train_cfg)
        loop_by_epoch = train_cfg.get("by_epoch", _LOOP_TYPES.get(str(train_cfg.get("type")), True))
    if "by_epoch" in lp and bool(lp["by_epoch"]) != bool(loop_by_epoch):
        warnings.warn(
            f"log_processor.by_epoch={lp['by_epoch']} but train_cfg.by_epoch={loop_by_epoch}: the log lines follow the "
            "training loop",
            stacklevel=3,
        )
    unused = sorted(k for k in ("num_digits", "log_with_hierarchy", "mean_pattern") if k in lp)
    if unused:
        warnings.warn(f"log_processor {unused}: formatting trainwright's writers do not have; ignored", stacklevel=3)


def _writers_from_visualizer(args: Mapping[str, Any]) -> list[Any] | None:
    """mmengine's ``visualizer=dict(vis_backends=[...])`` (or a top-level ``vis_backends``) as ``writers``; None when
    there is none.

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
        warnings.warn(
            "The config sets both writers and visualizer.vis_backends; writers wins and vis_backends is ignored",
            stacklevel=3,
        )
        return None
    if isinstance(backends, Mapping):
        backends = [backends]
    writers: list[Any] = ["console"]
    for i, backend in enumerate(backends):
        where = f"visualizer.vis_backends[{i}]"
        kind = backend.get("type") if isinstance(backend, Mapping) else None
        if kind not in _VIS_BACKENDS:
            raise ConfigError(
                f"{where}: {kind!r} is not a visualizer backend trainwright maps to a "
                f"writer.{did_you_mean(str(kind), list(_VIS_BACKENDS))} "
                f"Use one of {list(_VIS_BACKENDS)}, or give writers=[...] (trainwright.logging.WRITERS) instead of a "
                "visualizer"
            )
        name, known = _VIS_BACKENDS[kind]
        unknown = sorted(k for k in backend if k not in known and k not in ("type", "_scope_"))
        if unknown:
            raise ConfigError(
                f"{where} ({kind}): trainwright's {name!r} writer has no counterpart of {unknown}; drop them (it takes "
                f"{sorted(known)})"
            )
        mapped = {ours: backend[theirs] for theirs, ours in known.items() if ours is not None and theirs in backend}
        item: Any = dict(type=name, **mapped) if mapped else name
        if item not in writers:
            writers.append(item)
    return writers


def _data_preprocessor(cfg: Any, kwargs: dict[str, Any]) -> None:
    """mmengine's top-level ``data_preprocessor``: the model dict's unless it names its own (``model.setdefault``, as
    mmengine's Runner)."""
    if cfg is None:
        return
    model = kwargs["model"]
    if isinstance(model, Mapping):
        kwargs["model"] = {**model, "data_preprocessor": model.get("data_preprocessor", cfg)}
    else:
        warnings.warn(
            f"data_preprocessor at top level is not applied: the model is a built {type(model).__name__}, not a "
            "dict(type=...) "
            "it could be passed to (give the model its data_preprocessor yourself)",
            stacklevel=3,
        )


def _model_wrapper(cfg: Any, sync_bn: Any, kwargs: dict[str, Any]) -> None:
    """mmengine's ``model_wrapper_cfg=dict(type='MMDistributedDataParallel', find_unused_parameters=..., ...)`` and
    ``sync_bn``: the DDP strategy's arguments.

    Applied when the run is DDP (``strategy='ddp'``, or ``'auto'`` under a launcher with several
    processes); on one process there is no wrapper and no SyncBatchNorm, as in mmengine. Other
    wrapper types are refused. ``MMSeparateDistributedDataParallel`` (mmagic's GANs, whose
    ``train_step`` steps each submodule's optimizer) is the same strategy, with mmengine's
    ``broadcast_buffers=False`` default for it: the DDP strategy averages the gradients of a
    model that steps itself at each optim wrapper's update.
    """
    if sync_bn not in (None, False, "torch"):
        raise ConfigError(
            f"sync_bn={sync_bn!r} is not supported: trainwright converts to torch's SyncBatchNorm, sync_bn='torch' "
            "(mmcv's needs mmcv's CUDA ops)"
        )
    if not cfg and not sync_bn:
        return
    from trainwright.dist import launched_world_size

    wrapper = dict(cfg or {})
    typ = wrapper.pop("type", "MMDistributedDataParallel")
    if typ == "MMSeparateDistributedDataParallel":
        wrapper.setdefault("broadcast_buffers", False)  # that wrapper's default in mmengine
    if typ not in _DDP_WRAPPERS:
        raise ConfigError(
            f"model_wrapper_cfg type={typ!r} is not supported: trainwright's DDP wrapper answers to "
            f"{sorted(_DDP_WRAPPERS)}; "
            "for sharding use strategy=dict(type='fsdp', ...) instead of an FSDP model wrapper"
        )
    unknown = sorted(set(wrapper) - _DDP_WRAPPER_KEYS)
    if unknown:
        raise ConfigError(f"model_wrapper_cfg keys {unknown} are not supported; allowed: {sorted(_DDP_WRAPPER_KEYS)}")
    if sync_bn:
        wrapper["sync_batchnorm"] = True
    strategy = kwargs.get("strategy", "auto")
    name = strategy.get("type") if isinstance(strategy, Mapping) else strategy
    if name == "ddp" or (name in (None, "auto") and launched_world_size() > 1):
        kwargs["strategy"] = {**wrapper, **(dict(strategy) if isinstance(strategy, Mapping) else {}), "type": "ddp"}
    elif sync_bn and name not in (None, "auto", "single"):
        warnings.warn(
            f"sync_bn='torch' is applied under the DDP strategy only; with strategy {name!r} each process normalises "
            "with its own batch's "
            "statistics (SyncBuffersHook averages the running statistics after each epoch)",
            stacklevel=4,
        )


def _auto_scale_lr(cfg: Any, kwargs: dict[str, Any]) -> str | None:
    """mmengine's ``auto_scale_lr=dict(enable=True, base_batch_size=N)``: scale the optimizer's ``lr`` by the real batch
    size / N.

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
        raise ConfigError(
            f"auto_scale_lr.base_batch_size must be a positive int (the batch size the lr was tuned for), got {base!r}"
        )
    loader = kwargs.get("train_dataloader")
    batch = loader.get("batch_size") if isinstance(loader, Mapping) else getattr(loader, "batch_size", None)
    optim = kwargs.get("optim_wrapper")
    optimizer = optim.get("optimizer") if isinstance(optim, Mapping) else None
    if (
        not isinstance(batch, int)
        or not isinstance(optimizer, Mapping)
        or not isinstance(optimizer.get("lr"), (int, float))
    ):
        raise ConfigError(
            "auto_scale_lr=dict(enable=True) needs train_dataloader.batch_size and optim_wrapper.optimizer.lr in the "
            "config "
            f"(got batch_size={batch!r}, lr={optimizer.get('lr') if isinstance(optimizer, Mapping) else None!r}); set "
            "them, or enable=False"
        )
    strategy = kwargs.get("strategy")
    tp = strategy.get("tensor_parallel") if isinstance(strategy, Mapping) else None
    tp_size = tp.get("size", 1) if isinstance(tp, Mapping) else 1
    shards = (
        max(1, launched_world_size() // tp_size) if isinstance(tp_size, int) and tp_size > 0 else launched_world_size()
    )
    ratio = batch * shards / base
    kwargs["optim_wrapper"] = {**optim, "optimizer": {**optimizer, "lr": optimizer["lr"] * ratio}}  # type: ignore[dict-item]
    return (
        f"auto_scale_lr: lr {optimizer['lr']} -> {optimizer['lr'] * ratio:g} (batch size {batch} x {shards} data "
        f"shard(s) / base_batch_size {base})"
    )


def _translate_mmengine(kwargs: dict[str, Any]) -> None:
    """Accept mmengine's spellings of the parts trainwright has, in place."""
    train_cfg = kwargs.get("train_cfg")
    if isinstance(train_cfg, Mapping) and "type" in train_cfg:
        train_cfg = dict(train_cfg)
        typ = train_cfg.pop("type")
        with dropping_scope(
            train_cfg
        ):  # mmengine builds a typed loop config through its LOOPS registry: _scope_ dropped, as Registry.build does
            if typ not in _LOOP_TYPES:
                raise ConfigError(
                    f"train_cfg.type {typ!r} is not a loop trainwright has.{did_you_mean(str(typ), list(_LOOP_TYPES))} "
                    f"Use {list(_LOOP_TYPES)} or by_epoch=True/False"
                )
        train_cfg.setdefault("by_epoch", _LOOP_TYPES[typ])
        kwargs["train_cfg"] = train_cfg
    for key, loop in _EVAL_LOOP_TYPES.items():
        value = kwargs.get(key)
        if isinstance(value, Mapping) and "type" in value:
            value = dict(value)
            typ = value.pop("type")
            with dropping_scope(value):  # as train_cfg's
                if typ != loop:
                    raise ConfigError(
                        f"{key}.type {typ!r} is not a loop trainwright has; use {loop!r} or leave type out"
                    )
            kwargs[key] = value
        if key in ("val_cfg", "test_cfg") and isinstance(kwargs.get(key), Mapping):
            kwargs[key] = {k: v for k, v in kwargs[key].items() if k != "fp16"} | (
                {"autocast": True} if kwargs[key].get("fp16") else {}
            )
    for name in LOADERS:
        loader = kwargs.get(name)
        if isinstance(
            loader,
            Mapping,
            # translated here too (make_dataloader does it again, a no-op), so a bad sampler fails before anything is
            # built
        ):
            kwargs[name] = dataloader_arguments(loader, name)


def translate_runtime_keys(args: dict[str, Any]) -> None:
    """mmengine's runtime keys that become other top-level keys, in place: ``visualizer`` → ``writers``,
    ``log_processor`` → the logger hook's arguments; the others ignored with a warning."""
    writers = _writers_from_visualizer(args)
    if writers is not None:
        args["writers"] = writers
    _logger_from_log_processor(args)
    ignored = sorted(k for k in args if k in IGNORED_KEYS and args[k] is not None and k not in _TRANSLATED)
    if ignored:
        warnings.warn(
            f"Config keys {ignored} are mmengine runtime settings trainwright does not use; they are ignored",
            stacklevel=3,
        )


def translate_to_trainer(args: Mapping[str, Any], kwargs: dict[str, Any]) -> str | None:
    """The Trainer's arguments ``kwargs`` with mmengine's spellings and runtime keys of ``args`` applied, in place;
    returns the line to log (the scaled lr) or None."""
    _translate_mmengine(kwargs)
    _data_preprocessor(args.get("data_preprocessor"), kwargs)
    scaled = _auto_scale_lr(args.get("auto_scale_lr"), kwargs)
    wrapper_cfg = args.get("model_wrapper_cfg")
    if wrapper_cfg is None and args.get(
        "find_unused_parameters"
    ):  # mmengine's top-level key, used when no model_wrapper_cfg is given
        wrapper_cfg = dict(find_unused_parameters=True)
    _model_wrapper(wrapper_cfg, args.get("sync_bn"), kwargs)
    return scaled
