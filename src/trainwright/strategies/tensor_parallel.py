"""Tensor parallelism for the FSDP strategy: a plan of module paths, applied on the ``tp`` dimension of a ``(dp, tp)``
mesh.

``tensor_parallel=dict(size=2, plan={"blocks.*.attn.q": "colwise", ...})`` splits the layers a
plan names across the ``size`` ranks of each tensor-parallel group (torch's
``ColwiseParallel`` / ``RowwiseParallel`` / ``SequenceParallel``); FSDP then shards every
parameter over the data-parallel dimension. A plan pattern is a module path in which each
dot-separated component is matched with :func:`fnmatch.fnmatchcase`, so ``*`` stands for one
component and never crosses a dot. Users' guide: ``docs/parallelism.md``.
"""

from __future__ import annotations

import difflib
import fnmatch
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import torch
from torch import nn

from trainwright.registry import ConfigError, check_keys

if (
    TYPE_CHECKING
):  # torch.distributed.tensor is imported when tensor parallelism is used (it adds a second to `import trainwright`)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

#: The style names a plan may use: torch's ColwiseParallel, RowwiseParallel, SequenceParallel (defaults).
STYLE_NAMES = ("colwise", "rowwise", "sequence")
#: A plan: ``{module path pattern: "colwise" | "rowwise" | "sequence" | a ParallelStyle}``, or ``plan(model, tp_mesh)``.
Plan = Union[Mapping[str, Union[str, "ParallelStyle"]], Callable[[nn.Module, "DeviceMesh"], Any]]  # noqa: UP007 (forward references)


def make_style(name: str) -> ParallelStyle:
    """torch's ``ParallelStyle`` a plan's style name stands for, with its default layouts."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    styles: dict[str, Callable[[], ParallelStyle]] = {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "sequence": SequenceParallel,
    }
    return styles[name]()


@dataclass(frozen=True)
class TensorParallel:
    """The validated ``tensor_parallel`` argument of the FSDP strategy.

    Attributes:
        size: Ranks per tensor-parallel group (the ``tp`` dimension of the mesh); 1: off.
        plan: What to split (see :data:`Plan`); None only with ``size`` 1.
    """

    size: int
    plan: Plan | None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> TensorParallel:
        """Check ``dict(size=N, plan=...)`` (None: off): a positive size, a plan when size > 1, known style names.

        Raises:
            ConfigError: an unknown key, a bad size, a missing plan or an unknown style name.
        """
        if cfg is None:
            return cls(1, None)
        if not isinstance(cfg, Mapping):
            raise ConfigError(
                f"tensor_parallel must be a dict such as dict(size=2, plan={{'blocks.*.mlp.fc1': 'colwise', ...}}), "
                f"got {type(cfg).__name__}"
            )
        check_keys("tensor_parallel", cfg, {"size", "plan"}, error=ConfigError)
        size, plan = cfg.get("size", 1), cfg.get("plan")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(
                f"tensor_parallel.size must be a positive int (ranks per tensor-parallel group), got {size!r}"
            )
        if size > 1 and plan is None:
            raise ConfigError(
                f"tensor_parallel=dict(size={size}) needs a plan: which layers to split, e.g. "
                "plan={'blocks.*.mlp.fc1': 'colwise', 'blocks.*.mlp.fc2': 'rowwise'} (see docs/parallelism.md)"
            )
        if plan is not None and not callable(plan):
            if not isinstance(plan, Mapping):
                raise ConfigError(
                    "tensor_parallel.plan must be a dict of module path pattern -> style, or a callable plan(model, "
                    f"mesh); got {type(plan).__name__}"
                )
            for pattern, style in plan.items():
                if not isinstance(pattern, str):
                    raise ConfigError(f"tensor_parallel.plan keys are module path patterns (strings), got {pattern!r}")
                if not (style in STYLE_NAMES if isinstance(style, str) else _is_style(style)):
                    raise ConfigError(
                        f"tensor_parallel.plan[{pattern!r}] = {style!r} is not a style: use one of {list(STYLE_NAMES)} "
                        "or a torch.distributed.tensor.parallel.ParallelStyle object (e.g. "
                        "ColwiseParallel(input_layouts=Shard(1)))"
                    )
        return cls(size, plan)


def _is_style(obj: Any) -> bool:
    from torch.distributed.tensor.parallel import ParallelStyle

    return isinstance(obj, ParallelStyle)


def matches(pattern: str, path: str) -> bool:
    """Whether module ``path`` matches ``pattern``: as many dot-separated components, each matched by
    :func:`fnmatch.fnmatchcase`."""
    parts, names = pattern.split("."), path.split(".")
    return len(parts) == len(names) and all(fnmatch.fnmatchcase(n, p) for p, n in zip(parts, names))


def resolve_plan(model: nn.Module, plan: Mapping[str, str | ParallelStyle]) -> dict[str, ParallelStyle]:
    """``{module path: style object}`` for every module of ``model`` a pattern of ``plan`` matches.

    Raises:
        ValueError: a pattern matches no module (the message names the closest paths that
            exist), or one module is matched by two patterns.
    """
    paths = [name for name, _ in model.named_modules() if name]
    resolved: dict[str, ParallelStyle] = {}
    source: dict[str, str] = {}
    for pattern, style in plan.items():
        hits = [p for p in paths if matches(pattern, p)]
        if not hits:
            near = difflib.get_close_matches(pattern, paths, n=6, cutoff=0.0) or paths[:6]
            raise ValueError(
                f"tensor_parallel.plan pattern {pattern!r} matches no module of {type(model).__name__}. Module paths "
                "that exist "
                f"include {near}. In a pattern, '*' stands for exactly one dot-separated component (e.g. "
                "'blocks.*.attn.q')."
            )
        for path in hits:
            if path in resolved:
                raise ValueError(
                    f"tensor_parallel.plan patterns {source[path]!r} and {pattern!r} both match module {path!r}: give "
                    "each module one style"
                )
            resolved[path] = make_style(style) if isinstance(style, str) else style
            source[path] = pattern
    return resolved


def apply_plan(model: nn.Module, plan: Plan, tp_mesh: DeviceMesh) -> None:
    """Split ``model``'s layers across ``tp_mesh`` in place: each matched module gets its style; a callable plan is
    called with ``(model, tp_mesh)``."""
    from torch.distributed.tensor.parallel import parallelize_module

    if callable(plan) and not isinstance(plan, Mapping):
        plan(model, tp_mesh)
        return
    for path, style in resolve_plan(model, plan).items():
        parallelize_module(model.get_submodule(path), tp_mesh, style)


#: The ``(dp, tp)`` meshes made in this process, by device type and shape, with the default process group each was made
#: in (a weak reference): later Trainers of one layout share a mesh, as they share the launcher's group.
_meshes: dict[tuple[str, int, int], tuple[weakref.ref[Any], DeviceMesh]] = {}


def mesh_for(device_type: str, dp: int, tp: int) -> DeviceMesh:
    """The ``(dp, tp)`` mesh (dimension names ``"dp"``, ``"tp"``) of this process's default group, made once per layout.

    Each new mesh makes new process groups for its dimensions, which torch keeps until the
    default group goes: a process that builds many Trainers (a sweep under torchrun) would
    gather groups, and under NCCL their communicators' device memory. So the mesh of a layout
    is made once and reused while the default group it was made in lives; a model's DTensors
    stay usable after its Trainer closed.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    key, world = (device_type, dp, tp), dist.group.WORLD
    made = _meshes.get(key)
    if made is not None and made[0]() is world:
        return made[1]
    mesh = init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))
    _meshes[key] = (weakref.ref(world), mesh)
    return mesh


def check_divisible(world_size: int, size: int) -> None:
    """Raise a ValueError naming both numbers when ``world_size`` processes do not form whole tensor-parallel groups
    of ``size``."""
    if world_size % size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"tensor_parallel size {size} does not divide the world size {world_size}: the mesh is (dp, tp) = "
            "(world_size / size, size). "
            f"Start a multiple of {size} processes, or set tensor_parallel.size to one of {divisors}."
        )


def grads_on_mesh(params: list[torch.Tensor], mesh: DeviceMesh) -> list[torch.Tensor]:
    """``params`` for a clip function, every gradient a DTensor on ``mesh``: one total norm over all of them.

    Under FSDP + TP the parameters a plan does not split are sharded over the ``dp`` sub-mesh
    only, the split ones over both dimensions, and torch cannot combine norms of DTensors on
    different meshes. A parameter whose gradient lives on a sub-mesh is stood in for by a
    leaf DTensor on ``mesh`` whose gradient is a view of the same local shard (replicated over
    the dimensions it is not sharded on, which it is: those ranks computed it from the same
    activations), so clipping scales the real gradient in place.
    """
    from torch.distributed.tensor import DTensor, Placement, Replicate

    names = mesh.mesh_dim_names or ()
    out: list[torch.Tensor] = []
    for p in params:
        g = p.grad
        if not isinstance(g, DTensor) or g.device_mesh == mesh:
            out.append(p)
            continue
        placements: list[Placement] = [Replicate()] * mesh.ndim
        for name, placement in zip(g.device_mesh.mesh_dim_names or (), g.placements):
            placements[names.index(name)] = placement
        proxy = DTensor.from_local(
            g.to_local().detach(), mesh, placements, run_check=False, shape=g.shape, stride=g.stride()
        ).requires_grad_()
        proxy.grad = DTensor.from_local(
            g.to_local(), mesh, placements, run_check=False, shape=g.shape, stride=g.stride()
        )
        out.append(proxy)
    return out
