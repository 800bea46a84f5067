"""Compiling the model: whole (``compile=True`` / ``torch.compile`` arguments) or per block
(``compile=dict(regions=[...])``).

Regional compilation is torchtitan's per-block compile: ``module.compile()`` on each matched
submodule, in place, so every block of one class shares one compiled graph (one cache entry,
short compile times) and state-dict keys do not change. The other keys of the dict are
``torch.compile`` arguments. CUDA-graph modes (``"reduce-overhead"``) are checked here at
start for what can be seen cheaply: the device, and whether the train data has a fixed batch
shape (:func:`check_static_batches`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from trainwright.model.activation_checkpointing import select_modules
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.registry import check_keys

#: ``torch.compile`` arguments accepted in a ``compile`` dict, besides ``regions``.
COMPILE_KEYS = frozenset({"fullgraph", "dynamic", "backend", "mode", "options", "disable"})
#: Modes that record CUDA graphs (each distinct input shape is a new recording).
CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})


def compile_settings(compile: bool | Mapping[str, Any] | None) -> tuple[list[Any] | None, dict[str, Any]] | None:
    """``compile`` split into (regions or None for the whole model, ``torch.compile`` kwargs); None: no compilation.

    Raises:
        ValueError: an unknown key, or an empty ``regions``.
    """
    if compile is None or compile is False:
        return None
    if compile is True:
        return None, {}
    if not isinstance(compile, Mapping):
        raise TypeError(
            f"compile must be True, False or a dict of torch.compile arguments (plus regions=[...]), got {compile!r}"
        )
    kwargs = dict(compile)
    check_keys("compile", kwargs, COMPILE_KEYS | {"regions"}, ValueError)
    regions = kwargs.pop("regions", None)
    if regions is not None:
        regions = [regions] if isinstance(regions, (str, type)) else list(regions)
        if not regions:
            raise ValueError(
                "compile regions=[] names no module; name the repeated block, e.g. compile=dict(regions=['Block']), or "
                "use compile=True for the whole model"
            )
    return regions, kwargs


def uses_cuda_graphs(compile: bool | Mapping[str, Any] | None) -> bool:
    """True when ``compile`` asks for a mode that records CUDA graphs."""
    return isinstance(compile, Mapping) and compile.get("mode") in CUDA_GRAPH_MODES


def apply_compile(model: nn.Module, compile: bool | Mapping[str, Any] | None) -> list[nn.Module]:
    """Compile ``model`` in place (``nn.Module.compile``): whole, or each module ``regions`` names.

    Called by :meth:`~trainwright.strategies.Strategy.prepare` after activation checkpointing
    and before DDP / FSDP wrapping. Returns the compiled modules (``[model]`` when whole).
    Under a CUDA-graph mode ``fullgraph`` defaults to True, so a graph break (a host sync such
    as ``.item()`` inside a compiled region) is an error at the first step rather than a
    silently skipped graph.

    Raises:
        ValueError: a region matches no module (the message names the model's module classes), or an unknown key.
    """
    settings = compile_settings(compile)
    if settings is None:
        return []
    regions, kwargs = settings
    if uses_cuda_graphs(kwargs):
        kwargs.setdefault("fullgraph", True)
        device = next((p.device for p in model.parameters()), None)
        if device is not None and device.type != "cuda":
            warnings.warn(
                f"compile mode={kwargs['mode']!r} records CUDA graphs, which need a CUDA device; the model is on "
                f"{device.type!r}, "
                "where torch compiles it without CUDA graphs. Drop mode= (or run on CUDA) to silence this.",
                UserWarning,
                stacklevel=3,
            )
        elif regions is None:
            warnings.warn(
                f"compile mode={kwargs['mode']!r} on the whole model: the loss comes out of a CUDA graph whose memory "
                "the next step "
                "overwrites, while the metric store still holds the loss until it flushes. Prefer compiling the "
                "repeated blocks: "
                f"compile=dict(regions=['Block'], mode={kwargs['mode']!r}).",
                UserWarning,
                stacklevel=3,
            )
    targets = [model] if regions is None else select_modules(model, regions, setting="compile regions")
    for module in targets:
        module.compile(**kwargs)
    return targets


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` or one of its submodules is compiled: by ``compile=`` (:func:`apply_compile`), the user's own
    ``module.compile()``, or a ``torch.compile(module)`` held as a submodule.

    Read once before training, never on the step path. ``nn.Module.compile`` keeps the compiled
    call in the module's ``_compiled_call_impl`` (torch names no public accessor; listed in
    docs/architecture.md) and ``torch.compile(module)`` returns an ``OptimizedModule``.
    """
    from torch._dynamo.eval_frame import OptimizedModule  # torch.optim imports torch._dynamo already: no import cost

    return any(
        getattr(m, "_compiled_call_impl", None) is not None or isinstance(m, OptimizedModule) for m in model.modules()
    )


def compiled_parts(model: nn.Module, optim_wrapper: Any) -> list[str]:
    """What of a run is compiled, in words: ``"the model"``, ``"the optimizer step"`` (a compiled step of
    ``optim_wrapper``), both or none."""
    parts = []
    if is_compiled(model):
        parts.append("the model")
    if any(ow.compiled_step is not None for ow in optim_wrappers_of(optim_wrapper).values()):
        parts.append("the optimizer step")
    return parts


@contextlib.contextmanager
def run_eagerly(optim_wrapper: Any = None) -> Iterator[None]:
    """Inside, compiled code runs eagerly: compiled modules and functions (``torch.compiler.set_stance("force_eager")``)
    and
    each compiled optimizer step of ``optim_wrapper`` (its optimizer's own step, see
    :meth:`~trainwright.optim.compiled_step.CompiledStep.eager`).

    For code that must run under a dispatch mode ``torch.compile`` gives up on for good (the
    FLOP counter of :class:`~trainwright.hooks.flops.FlopsHook`); compilation resumes after the block.
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.compiler.set_stance("force_eager"))
        for ow in optim_wrappers_of(optim_wrapper).values():
            if ow.compiled_step is not None:
                stack.enter_context(ow.compiled_step.eager())
        yield


def check_static_batches(compile: bool | Mapping[str, Any] | None, dataloader: Any) -> None:
    """Under a CUDA-graph mode, refuse train data whose last batch is short (each new shape is a new CUDA-graph
    recording).

    ``dataloader`` is a ``DataLoader`` or the Trainer's dict of its arguments; what cannot be
    known cheaply (a custom batch sampler, an iterable dataset) is not checked.

    Raises:
        ValueError: the last batch of an epoch would be smaller than the others.
    """
    if not uses_cuda_graphs(compile) or dataloader is None:
        return
    if isinstance(dataloader, Mapping):  # the Trainer's dict of DataLoader arguments
        batch_size = dataloader.get("batch_size", 1) if dataloader.get("batch_sampler") is None else None
        drop_last, dataset = dataloader.get("drop_last", False), dataloader.get("dataset")
    else:  # a DataLoader: batch_size is None under a custom batch sampler
        batch_size, drop_last, dataset = (
            getattr(dataloader, "batch_size", None),
            getattr(dataloader, "drop_last", False),
            getattr(dataloader, "dataset", None),
        )
    if (
        drop_last or not isinstance(batch_size, int) or dataset is None or isinstance(dataset, Mapping)
    ):  # a dataset config: its size is not known yet
        return
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return
    if n % batch_size:
        raise ValueError(
            f"compile mode={compile['mode']!r} records CUDA graphs for fixed shapes, "  # type: ignore[index]
            "but the train dataloader's last "
            "batch holds "
            f"{n % batch_size} samples instead of {batch_size} ({n} samples): set drop_last=True in the train "
            "dataloader "
            "(or a dataset size divisible by the batch size), or drop mode="
        )


__all__ = [
    "COMPILE_KEYS",
    "CUDA_GRAPH_MODES",
    "apply_compile",
    "check_static_batches",
    "compile_settings",
    "uses_cuda_graphs",
]
