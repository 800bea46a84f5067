"""Optim-wrapper constructors: model + config → optimizer param groups → optim wrapper.

:class:`DefaultOptimWrapperConstructor` is mmengine's: ``paramwise_cfg`` gives per-parameter
lr / weight-decay multipliers by rule (bias, normalization, depthwise conv, 1-d,
deformable-conv offsets) or by name (``custom_keys``, the longest contained key wins).
Parameters with equal options are merged into one group (first-appearance order): the same
update as mmengine's one group per parameter, with a handful of groups instead of hundreds.
``paramwise_cfg=dict(..., merge_groups=False)`` gives mmengine's layout.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from trainwright.optim.optim_wrapper import OptimWrapper
from trainwright.registry import (
    OPTIM_WRAPPER_CONSTRUCTORS,
    OPTIM_WRAPPERS,
    OPTIMIZERS,
    TYPO_CUTOFF,
    check_keys,
    dropping_scope,
)

#: ``paramwise_cfg`` keys and what each multiplies.
PARAMWISE_KEYS = {
    "custom_keys": "per-name options: "
    "{substring of 'prefix.name': dict(lr_mult=..., decay_mult=..., <any optimizer option>)}",
    "bias_lr_mult": "lr of every bias (not of normalization layers or deformable-conv offsets)",
    "bias_decay_mult": "weight_decay of every bias (not of normalization layers or deformable-conv offsets)",
    "norm_decay_mult": "weight_decay of the weight and bias of normalization layers "
    "(BatchNorm, InstanceNorm, GroupNorm, LayerNorm, RMSNorm)",
    "dwconv_decay_mult": "weight_decay of depthwise Conv2d layers (in_channels == groups)",
    "flat_decay_mult": "weight_decay of every other 1-d parameter",
    "dcn_offset_lr_mult": "lr of the conv_offset layers inside deformable convolutions "
    "(mmcv DeformConv2d / ModulatedDeformConv2d)",
    "bypass_duplicate": "True: a parameter shared by several modules is added once (its first name's options)",
    "merge_groups": "False: one param group per parameter (mmengine's layout) instead of one per distinct options",
}
_DECAY_KEYS = ("bias_decay_mult", "norm_decay_mult", "dwconv_decay_mult", "flat_decay_mult")
_NORMS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.GroupNorm,
    nn.LayerNorm,
)
if hasattr(nn, "RMSNorm"):
    _NORMS = (*_NORMS, nn.RMSNorm)
# mmcv's deformable convolutions, recognised by class name so mmcv need not be importable here.
_DCN_NAMES = frozenset({"DeformConv2d", "ModulatedDeformConv2d"})


def _is_dcn(module: nn.Module) -> bool:
    return any(c.__name__ in _DCN_NAMES for c in type(module).__mro__)


def _optimizer_options(cfg: Mapping[str, Any]) -> tuple[set[str] | None, dict[str, Any]]:
    """The option names the optimizer class accepts (None: it takes ``**kwargs``) and their defaults."""
    typ = cfg.get("type")
    with dropping_scope(
        dict(cfg)
    ):  # an unknown type names the config's _scope_, as in OPTIMIZERS.build, which drops it later
        cls = OPTIMIZERS.get(typ) if isinstance(typ, str) else typ
    if not callable(cls):
        return None, {}
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return None, {}
    params = {n: p for n, p in sig.parameters.items() if n != "params"}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None, {}
    return set(params), {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}


def build_optimizer(model: nn.Module, cfg: Mapping[str, Any] | torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Build ``cfg`` (``dict(type="AdamW", lr=...)``; any ``torch.optim`` name) over the trainable parameters."""
    if isinstance(cfg, torch.optim.Optimizer):
        return cfg
    if not isinstance(cfg, Mapping):
        raise TypeError(
            "optimizer must be a torch.optim.Optimizer or a dict like dict(type='SGD', lr=0.1), got "
            f"{type(cfg).__name__}"
        )
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(model).__name__} has no parameters that require gradients; nothing to optimize")
    return OPTIMIZERS.build(cfg, params=params)


@OPTIM_WRAPPER_CONSTRUCTORS.register
class DefaultOptimWrapperConstructor:
    """Build an optim wrapper with per-parameter options (mmengine's ``DefaultOptimWrapperConstructor``).

    ``optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, weight_decay=1e-4),
    paramwise_cfg=dict(norm_decay_mult=0.0, custom_keys={"backbone": dict(lr_mult=0.1)}))``
    gives every parameter of the model the options its rules say (see ``PARAMWISE_KEYS``):

    * ``custom_keys``: the longest key that is a substring of ``f"{prefix}.{name}"`` (the
      module's dotted name, a dot, the parameter's own name; ties go to the alphabetically
      first key) sets ``lr = lr * lr_mult`` and ``weight_decay = weight_decay * decay_mult``
      (multipliers default to 1), copies every other entry (``momentum``, ``betas``...) into
      the group, and the rules below are not applied to that parameter.
    * otherwise: ``bias_lr_mult`` for biases (not of normalization layers, not inside a
      deformable conv), ``dcn_offset_lr_mult`` for deformable-conv offset layers; weight decay:
      ``norm_decay_mult`` for normalization layers, else ``bias_decay_mult`` for biases, else
      ``dwconv_decay_mult`` for depthwise ``Conv2d``, else ``flat_decay_mult`` for 1-d
      parameters. An absent multiplier changes nothing.

    Frozen parameters (``requires_grad=False``) are left out, as the builder without
    ``paramwise_cfg`` does. Parameters whose options are equal share a group unless
    ``merge_groups=False``.

    Subclass it (and register it in ``trainwright.registry.OPTIM_WRAPPER_CONSTRUCTORS``) to
    change the rules: override :meth:`add_params` or :meth:`__call__`; select it with
    ``optim_wrapper=dict(constructor="MyConstructor", ...)``. Such a subclass's own
    ``paramwise_cfg`` keys (mmseg's and mmpretrain's layer-wise decay: ``decay_rate``,
    ``num_layers``...) are accepted; declaring them in :attr:`paramwise_keys` makes a misspelt
    key an error again.

    Args:
        optim_wrapper_cfg: The optim wrapper config: ``optimizer`` (required) and the
            wrapper's own arguments (``type``, ``accumulative_counts``, ``clip_grad``, ...).
        paramwise_cfg: Per-parameter options (keys of ``PARAMWISE_KEYS``).

    Raises:
        KeyError: An unknown ``paramwise_cfg`` key or ``custom_keys`` entry (with the closest
            valid name).
        ValueError: A decay multiplier without ``weight_decay`` in the optimizer config, a
            learning-rate multiplier without a learning rate, a parameter shared by two modules
            without ``bypass_duplicate=True``.
    """

    def __init__(self, optim_wrapper_cfg: Mapping[str, Any], paramwise_cfg: Mapping[str, Any] | None = None) -> None:
        if not isinstance(optim_wrapper_cfg, Mapping) or "optimizer" not in optim_wrapper_cfg:
            raise TypeError(
                "optim_wrapper_cfg must be a dict with an 'optimizer' key, e.g. dict(optimizer=dict(type='SGD', "
                f"lr=0.1)); got {optim_wrapper_cfg!r}"
            )
        if paramwise_cfg is not None and not isinstance(paramwise_cfg, Mapping):
            raise TypeError(
                "paramwise_cfg must be a dict like dict(norm_decay_mult=0.0) or None, got "
                f"{type(paramwise_cfg).__name__}"
            )
        self.optim_wrapper_cfg = dict(optim_wrapper_cfg)
        optimizer = self.optim_wrapper_cfg.pop("optimizer")
        self.paramwise_cfg: dict[str, Any] = dict(paramwise_cfg or {})
        self._seen: dict[int, str] = {}  # id(parameter) -> its first name, while add_params runs
        #: The learning rate and weight decay the multipliers scale (the optimizer's own default lr when the config
        #: gives none).
        self.base_lr: float | None = None
        self.base_wd: float | None = None
        self._accepted_options: set[str] | None = None
        if isinstance(optimizer, torch.optim.Optimizer):
            if self.paramwise_cfg:
                raise TypeError(
                    "paramwise_cfg builds the optimizer's param groups, so optimizer must be a config dict like "
                    f"dict(type='SGD', lr=0.1), not a built {type(optimizer).__name__}"
                )
            self.optimizer_cfg: Any = optimizer
            return
        if not isinstance(optimizer, Mapping):
            raise TypeError(
                "optimizer must be a torch.optim.Optimizer or a dict like dict(type='SGD', lr=0.1), got "
                f"{type(optimizer).__name__}"
            )
        self.optimizer_cfg = dict(optimizer)
        accepted, signature_defaults = (
            _optimizer_options(self.optimizer_cfg) if "type" in self.optimizer_cfg else (None, {})
        )
        self._accepted_options = accepted
        self.base_lr = self.optimizer_cfg.get("lr", signature_defaults.get("lr"))
        self.base_wd = self.optimizer_cfg.get("weight_decay")
        self._validate()

    #: The ``paramwise_cfg`` keys a subclass reads itself (mmpretrain's layer-wise decay: ``decay_rate``,
    #: ``decay_type``,
    #: ``num_layers``), accepted beside ``PARAMWISE_KEYS``. None (not declared): a subclass that overrides
    #: :meth:`add_params` or :meth:`__call__` accepts any other key, as mmengine does; this class refuses them.
    paramwise_keys: ClassVar[frozenset[str] | None] = None

    def _extra_keys_allowed(self) -> bool:
        """Whether undeclared ``paramwise_cfg`` keys are this constructor's own: it reads ``paramwise_cfg`` in an
        overridden method."""
        cls = type(self)
        return cls.paramwise_keys is None and (
            cls.add_params is not DefaultOptimWrapperConstructor.add_params
            or cls.__call__ is not DefaultOptimWrapperConstructor.__call__
        )

    def _validate(self) -> None:
        cfg = self.paramwise_cfg
        own = type(self).paramwise_keys or frozenset()
        if not self._extra_keys_allowed():
            check_keys(
                "paramwise_cfg",
                cfg,
                {*PARAMWISE_KEYS, *own},
                hint=f"Allowed: {sorted({*PARAMWISE_KEYS, *own})} (what each does: docs/optim.md, paramwise_cfg); a "
                "constructor subclass that reads "
                "keys of its own declares them: paramwise_keys = frozenset({...})",
            )
        for key in ("bias_lr_mult", "dcn_offset_lr_mult", *_DECAY_KEYS):
            value = cfg.get(key)
            if key in cfg and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"paramwise_cfg {key}={value!r} must be a number (a multiplier, e.g. {key}=0.0)")
        custom = cfg.get("custom_keys", {})
        if not isinstance(custom, Mapping):
            raise TypeError(
                f"paramwise_cfg custom_keys must be a dict {{name substring: dict(lr_mult=..., decay_mult=...)}}, got "
                f"{type(custom).__name__}"
            )
        allowed = None if self._accepted_options is None else {"lr_mult", "decay_mult", *self._accepted_options}
        for name, entry in custom.items():
            if not isinstance(entry, Mapping):
                raise TypeError(
                    f"paramwise_cfg custom_keys[{name!r}] must be a dict like dict(lr_mult=0.1, decay_mult=0.0), got "
                    f"{entry!r}"
                )
            if allowed is not None:
                check_keys(
                    f"paramwise_cfg custom_keys[{name!r}]",
                    entry,
                    allowed,
                    hint="Allowed: lr_mult, decay_mult and the optimizer's options "
                    f"{sorted(allowed - {'lr_mult', 'decay_mult'})}",
                )
            if "decay_mult" in entry and self.base_wd is None:
                raise ValueError(
                    f"paramwise_cfg custom_keys[{name!r}] has decay_mult, which multiplies the optimizer's "
                    f"weight_decay, but optimizer={self.optimizer_cfg!r} gives none: add weight_decay=... to it"
                )
        for key in _DECAY_KEYS:
            if key in cfg and self.base_wd is None:
                raise ValueError(
                    f"paramwise_cfg {key} multiplies the optimizer's weight_decay, but "
                    f"optimizer={self.optimizer_cfg!r} gives none: add weight_decay=... to it"
                )
        wants_lr = any(k in cfg for k in ("bias_lr_mult", "dcn_offset_lr_mult")) or any(
            "lr_mult" in e for e in custom.values()
        )
        if wants_lr and self.base_lr is None:
            raise ValueError(
                f"paramwise_cfg has a learning-rate multiplier, but optimizer={self.optimizer_cfg!r} has no lr to "
                "multiply: add lr=... to it"
            )

    # -- param groups ---------------------------------------------------------------------
    def add_params(
        self, params: list[dict[str, Any]], module: nn.Module, prefix: str = "", is_dcn_module: bool = False
    ) -> None:
        """Append one ``{"params": [p], "param_names": [name], **options}`` per trainable parameter of ``module``
        (recursively) to ``params``.

        Args:
            params: The list of groups, extended in place.
            module: The module whose parameters are added (its children too).
            prefix: The module's dotted name in the model.
            is_dcn_module: Whether ``module`` is a child of a deformable convolution.
        """
        cfg = self.paramwise_cfg
        seen = self._seen
        custom = cfg.get("custom_keys", {})
        keys = sorted(sorted(custom), key=len, reverse=True)  # longest first; alphabetical among equals
        is_norm = isinstance(module, _NORMS)
        is_dwconv = isinstance(module, nn.Conv2d) and module.in_channels == module.groups
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            full = f"{prefix}.{name}" if prefix else name
            if id(param) in seen:
                if cfg.get("bypass_duplicate", False):
                    continue
                raise ValueError(
                    f"Parameter {full!r} is the same tensor as {seen[id(param)]!r} (shared / tied weights), and torch "
                    "refuses a parameter in two "
                    "param groups. Set paramwise_cfg bypass_duplicate=True to add it once, with the options of its "
                    "first name."
                )
            seen[id(param)] = full
            group: dict[str, Any] = {"params": [param]}
            key = next((k for k in keys if k in f"{prefix}.{name}"), None)
            if key is not None:
                entry = custom[key]
                if self.base_lr is not None:
                    group["lr"] = self.base_lr * entry.get("lr_mult", 1.0)
                if self.base_wd is not None:
                    group["weight_decay"] = self.base_wd * entry.get("decay_mult", 1.0)
                group.update(entry)
            else:
                self._apply_rules(group, name, param, module, prefix, is_norm, is_dwconv, is_dcn_module)
            group["param_names"] = [full]  # torch keeps names beside the parameters (state_dict, errors)
            params.append(group)
        child_in_dcn = _is_dcn(module)
        for child_name, child in module.named_children():
            self.add_params(params, child, f"{prefix}.{child_name}" if prefix else child_name, child_in_dcn)

    def _apply_rules(
        self,
        group: dict[str, Any],
        name: str,
        param: torch.Tensor,
        module: nn.Module,
        prefix: str,
        is_norm: bool,
        is_dwconv: bool,
        in_dcn: bool,
    ) -> None:
        cfg = self.paramwise_cfg
        base_lr, base_wd = self.base_lr, self.base_wd
        if name == "bias" and not (is_norm or in_dcn) and "bias_lr_mult" in cfg:
            group["lr"] = base_lr * cfg["bias_lr_mult"]  # type: ignore[operator]  # checked in _validate
        if in_dcn and "conv_offset" in prefix and isinstance(module, nn.Conv2d) and "dcn_offset_lr_mult" in cfg:
            group["lr"] = base_lr * cfg["dcn_offset_lr_mult"]  # type: ignore[operator]
        if base_wd is None:
            return
        if is_norm and "norm_decay_mult" in cfg:
            group["weight_decay"] = base_wd * cfg["norm_decay_mult"]
        elif name == "bias" and not in_dcn and "bias_decay_mult" in cfg:
            group["weight_decay"] = base_wd * cfg["bias_decay_mult"]
        elif is_dwconv and "dwconv_decay_mult" in cfg:
            group["weight_decay"] = base_wd * cfg["dwconv_decay_mult"]
        elif param.ndim == 1 and not in_dcn and "flat_decay_mult" in cfg:
            group["weight_decay"] = base_wd * cfg["flat_decay_mult"]

    def _check_custom_keys(self, model: nn.Module) -> None:
        """A ``custom_keys`` key contained in no parameter's name: a near-miss of a name is refused, any other key is
        warned about.

        A typo (``backbon.0`` for ``backbone.0``) would leave the parameters it meant at the default
        options (a layer meant to be frozen trains at full lr): ``KeyError``. A key close to no name
        is usually inherited from a base schedule written for another architecture (mmpretrain's
        Swin schedule's ``.absolute_pos_embed`` under a ConvNeXt): mmengine applies it to nothing,
        and so does trainwright, with a warning naming it.
        """
        custom = self.paramwise_cfg.get("custom_keys", {})
        if not custom:
            return
        # the string add_params matches against: f"{prefix}.{name}" (".weight" for a parameter of the model itself)
        names = [n if "." in n else f".{n}" for n, _ in model.named_parameters(remove_duplicate=False)]
        parts: list[str] | None = None
        for key in sorted(custom):
            if any(key in n for n in names):
                continue
            if parts is None:
                parts = sorted(
                    {
                        ".".join(p[i:j])
                        for p in (n.lstrip(".").split(".") for n in names)
                        for i in range(len(p))
                        for j in range(i + 1, len(p) + 1)
                    }
                )
            close = difflib.get_close_matches(key.strip("."), parts, n=3, cutoff=0.6)
            shown = [n.lstrip(".") for n in names[:6]]
            message = (
                f"paramwise_cfg custom_keys[{key!r}] matches no parameter of {type(model).__name__}: a key applies to "
                "every parameter whose "
                f"dotted name contains it, so its options {dict(custom[key])!r} apply to nothing. "
                + (f"Close names: {', '.join(repr(c) for c in close)}. " if close else "")
                + f"Parameter names: {', '.join(repr(n) for n in shown)}{', ...' if len(names) > len(shown) else ''} "
                f"({len(names)} in all)."
            )
            if difflib.get_close_matches(
                key.strip("."), parts, n=1, cutoff=TYPO_CUTOFF
            ):  # a near-miss: the parameters meant would train with the default options
                raise KeyError(message + " Correct the key to the name meant (or remove it).")
            warnings.warn(
                message
                + " (A key of a base config written for another model; remove it from paramwise_cfg to silence this.)",
                stacklevel=2,
            )

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        """The optimizer's param groups for ``model`` (merged by equal options unless ``merge_groups=False``).

        Each group also holds ``"param_names"``: the dotted names of its parameters (torch
        keeps them in the optimizer's ``state_dict``); dropped from every group when a
        subclass's :meth:`add_params` adds groups without them.
        """
        self._check_custom_keys(model)
        groups: list[dict[str, Any]] = []
        self._seen = {}
        self.add_params(groups, model)
        if not all("param_names" in g for g in groups):  # torch takes names on every group or on none
            for g in groups:
                g.pop("param_names", None)
        if not self.paramwise_cfg.get("merge_groups", True):
            return groups
        merged: list[dict[str, Any]] = []
        for g in groups:
            options = {k: v for k, v in g.items() if k not in ("params", "param_names")}
            for m in merged:
                if m["_options"] == options:
                    m["params"] += g["params"]
                    if "param_names" in g:
                        m["param_names"] += g["param_names"]
                    break
            else:
                merged.append(
                    {
                        **g,
                        "params": list(g["params"]),
                        **({"param_names": list(g["param_names"])} if "param_names" in g else {}),
                        "_options": options,
                    }
                )
        for m in merged:
            del m["_options"]
        return merged

    def __call__(self, model: nn.Module) -> OptimWrapper:
        """Build the optimizer over ``model``'s parameters (with the param-wise options) and wrap it."""
        if not self.paramwise_cfg:
            optimizer = build_optimizer(model, self.optimizer_cfg)
        else:
            groups = self.param_groups(model)
            if not groups:
                raise ValueError(
                    f"{type(model).__name__} has no parameters that require gradients; nothing to optimize"
                )
            optimizer = OPTIMIZERS.build(self.optimizer_cfg, params=groups)
        wrapper_cfg = dict(self.optim_wrapper_cfg)
        wrapper_cfg.setdefault("type", "OptimWrapper")
        return OPTIM_WRAPPERS.build(wrapper_cfg, optimizer=optimizer)


__all__ = ["DefaultOptimWrapperConstructor", "PARAMWISE_KEYS", "build_optimizer"]
