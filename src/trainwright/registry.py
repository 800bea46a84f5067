"""Registries: turn ``dict(type="Name", **kwargs)`` into objects.

The registries live at the bottom of the layer stack because the trainer itself accepts
dicts for its parts (``optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1))``); the config
layer above only parses files into such dicts.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config cannot be read, merged, overridden or built; the message says where (file and line, or the
    key path such as ``model.backbone``) and how to fix it. The original error, if any, is its ``__cause__``.

    The command line prints the message alone (no traceback, unless ``--debug``) and exits with status 2.
    """


class Registry:
    """A name → class (or factory) table with a ``build`` that explains its failures.

    Args:
        name: What the registry holds, used in error messages (e.g. ``"optimizer"``).
        fallback: Optional callable ``name -> object | None`` consulted for names not
            registered here (used to reach every ``torch.optim`` optimizer by name).
        import_name: Where the registry is importable from (``"trainwright.registry.MODELS"``),
            for the "how to register" hint of unknown names.
        build_list: What :meth:`build` makes of a list of configs, given the built items
            (``MODELS``: ``nn.Sequential``, as mmengine's ``build_model_from_cfg``); None: a
            list is returned unchanged, like any other non-mapping.
        parent / scope: mmengine's registry tree: a child registry (``Registry("model",
            parent=MODELS, scope="mine")``) looks up what it lacks in its parent, and a name
            scoped with a child's scope (``type="mine.Net"``) is found in that child from
            anywhere in the tree. ``scope`` defaults to the caller's top-level package.
        locations: Modules imported the first time a name is looked up or listed (they register into
            this registry), as mmengine's ``locations``; also before a registration from a module outside
            ``scope``, so that a clash with one of their names is reported there. A mapping ``name -> module``
            imports only the module of the name looked up (all of them when the names are listed), and before
            an outside registration only the modules of the names it takes: a run loads the components it uses.
        build_func: ``build_func(cfg, *args, registry=self, **kwargs)`` replaces :meth:`build`'s
            default (:func:`build_from_cfg`); a child inherits its parent's.
    """

    def __init__(
        self,
        name: str,
        fallback: Callable[[str], Any] | None = None,
        import_name: str | None = None,
        build_list: Callable[[list[Any]], Any] | None = None,
        parent: Registry | None = None,
        scope: str | None = None,
        locations: Sequence[str] | Mapping[str, str] = (),
        build_func: Callable[..., Any] | None = None,
    ) -> None:
        self.name = name
        self.import_name = import_name
        self._table: dict[str, Any] = {}
        self._fallback = fallback
        self._build_list = build_list
        self.parent = parent
        self.scope = scope if scope is not None else sys._getframe(1).f_globals.get("__name__", "").split(".")[0]  # noqa: SLF001 - mmengine's infer_scope
        self.children: dict[str, Registry] = {}
        # a mapping: name -> the module that registers it, imported when that name is looked up; a sequence: modules
        # imported, all of them, at the first lookup
        self._located: dict[str, str] = dict(locations) if isinstance(locations, Mapping) else {}
        self._locations = [] if isinstance(locations, Mapping) else list(locations)
        self.build_func: Callable[..., Any] | None = (
            build_func if build_func is not None else (parent.build_func if parent is not None else None)
        )
        if parent is not None:
            if self.scope in parent.children:
                raise KeyError(
                    f"The {parent.name} registry has a child of scope {self.scope!r} already; give this registry "
                    "another scope="
                )
            parent.children[self.scope] = self

    @staticmethod
    def split_scope_key(key: str) -> tuple[str | None, str]:
        """``"mmdet.ResNet"`` -> ``("mmdet", "ResNet")``, ``"ResNet"`` -> ``(None, "ResNet")`` (mmengine's)."""
        scope, dot, rest = key.partition(".")
        return (scope, rest) if dot and scope and rest else (None, key)

    def _root(self) -> Registry:
        return self if self.parent is None else self.parent._root()

    def _search_child(self, scope: str) -> Registry | None:
        if self.scope == scope:
            return self
        for child in self.children.values():
            found = child._search_child(scope)
            if found is not None:
                return found
        return None

    def register(self, obj: T | None = None, *, name: str | Sequence[str] | None = None, force: bool = False) -> Any:
        """Register ``obj`` under ``name`` (default: its ``__name__``); usable as a decorator.

        ``name`` may be a list of names (mmengine's ``register_module(name=[...])``): ``obj`` is
        registered under each. ``obj`` must be callable (a class or a function: ``build`` calls it).
        A name taken by another object is an error unless ``force=True``, and then nothing is
        registered; the same class defined again (same module and qualified name: a config file
        or module run twice) replaces the old one.
        """
        if not isinstance(force, bool):
            raise TypeError(f"{self.name} registry: force must be a bool, got {type(force).__name__}")
        if not (
            name is None
            or isinstance(name, str)
            or (isinstance(name, Sequence) and all(isinstance(n, str) for n in name))
        ):
            hint = (
                f"; as a decorator, call it: @{self.import_name or 'REGISTRY'}.register_module()"
                if callable(name)
                else ""
            )
            raise TypeError(
                f"{self.name} registry: name must be None, a str or a list of str, got {type(name).__name__}{hint}"
            )
        if name is not None and not isinstance(name, str) and not name:
            raise ValueError(
                f"{self.name} registry: name is an empty list, which registers nothing; give at least one name, or "
                "None for the __name__"
            )

        def _do(o: T) -> T:
            if not callable(o):
                raise TypeError(
                    f"{self.name} registry: only a class or a function can be registered (build calls it), got "
                    f"{type(o).__name__}"
                )
            keys = [name or o.__name__] if name is None or isinstance(name, str) else list(name)  # type: ignore[attr-defined]
            if not str(getattr(o, "__module__", "")).startswith(f"{self.scope}."):
                # their names first: a clash with one is reported here (force=True replaces it), as when they loaded
                # eagerly
                self._import_locations(keys)
            for key in keys:
                if (
                    key in self._table
                    and not force
                    and self._table[key] is not o
                    and not _same_definition(self._table[key], o)
                ):
                    raise KeyError(
                        f"{key!r} is already registered in the {self.name} registry; pass force=True to replace it"
                    )
            for key in keys:
                self._table[key] = o
            return o

        return _do(obj) if obj is not None else _do

    def register_module(self, name: str | Sequence[str] | None = None, force: bool = False, module: Any = None) -> Any:
        """mmengine's spelling of :meth:`register`, for ported code: ``@MODELS.register_module()``,
        ``register_module(name="Foo")`` or ``name=["Foo", "Bar"]``, ``register_module(force=True)``,
        ``MODELS.register_module(module=SomeClass)`` (registers at once and returns the class).

        As in mmengine, a ``name`` that is not a str or a list of str and a ``module`` that is not
        callable are ``TypeError``; unlike mmengine, the same class defined twice (a config run
        twice) is not a name clash.
        """
        return self.register(module, name=name, force=force)

    def get(self, key: str) -> Any:
        """Return the entry for ``key``; raise ``KeyError`` naming close matches if unknown (its ``unknown_type`` is the
        name looked for).

        A name with an mmengine scope (``"mmdet.RetinaNet"``: the scope, a dot, the name) that is
        not registered as written is looked up without its scope, as a config's ``_scope_`` key
        is dropped: trainwright has one registry per kind. When neither is known, the error says
        the scope was ignored (it is the innermost scope, so a ``_scope_`` or ``default_scope``
        around it is not named).
        """
        found = self._find(key)
        if found is not None:
            return found
        scope, bare = self.split_scope_key(key)
        scoped = scope is not None  # "mmdet.RetinaNet"; not ".Foo" or "Foo."
        bare = bare.rpartition(".")[2] if scoped else bare  # "a.b.Name": the name is the last part
        how = (
            f" To add one, decorate its class with @{self.import_name}.register() in a module the config imports "
            "(custom_imports = dict(imports=['my_module'])), or define it in a .py config."
            if self.import_name
            else ""
        )
        error = KeyError(
            f"Unknown {self.name} type {key!r}.{did_you_mean(bare, self.names())} Registered: "
            f"{', '.join(sorted(self.names()))}.{how}"
        )
        error.unknown_type = bare  # type: ignore[attr-defined]  # Trainer.from_config adds its default_scope hint to these
        if scoped:
            error.args = (
                error.args[0]
                + ignored_scope_hint(error, "type", scope, subject=f"The scope {scope!r} of type={key!r}"),
            )
        raise error

    def _find(self, key: str) -> Any:
        """``key`` here (or in the parents), else, scoped (``"a.b.Name"``), in the registry of its first scope with the
        rest of the key, as mmengine's ``get``; None when unknown.

        A scope no registry of this tree has is dropped (trainwright has one registry per kind).
        """
        found = self._lookup(key)
        if found is not None:
            return found
        scope, rest = self.split_scope_key(key)
        if scope is None:
            return None
        owner = self._root()._search_child(scope)  # a registry of that scope in this tree
        return (owner or self)._find(rest)

    def _import_locations(self, keys: Sequence[str] | None = None) -> None:
        """Import the ``locations`` modules, once (they register into this registry): the sequence's, and the mapping's
        for ``keys`` (None: all of them)."""
        if self._locations:
            modules, self._locations = self._locations, []
            import_modules_from_strings(modules)
        located = self._located
        wanted = list(located) if keys is None else [k for k in keys if k in located]
        if wanted:
            import_modules_from_strings(sorted({located.pop(k) for k in wanted}))

    def _lookup(self, key: str) -> Any:
        self._import_locations([key])
        if key in self._table:
            return self._table[key]
        if self._fallback is not None:
            found = self._fallback(key)
            if found is not None:
                return found
        return self.parent._lookup(key) if self.parent is not None else None

    def names(self) -> list[str]:
        """All names this registry can build (fallback names included where listable)."""
        self._import_locations()
        names = set(self._table)
        lister = getattr(self._fallback, "names", None)
        if callable(lister):
            names.update(lister())
        return sorted(names)

    def __contains__(self, key: str) -> bool:
        try:
            self.get(key)
        except KeyError:
            return False
        return True

    def build(
        self, cfg: Mapping[str, Any] | Any, *, default_args: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """Build an object from ``cfg``: a dict with ``type`` (a name or a class) and kwargs.

        Anything that is not a mapping is returned unchanged (objects first, configs second;
        mmengine raises a ``TypeError`` instead), whatever the defaults; except a list in a
        registry with ``build_list`` (``MODELS``): each item is built with the same defaults
        and the list handed to it (``MODELS.build([dict(type="Conv"), dict(type="ReLU")])`` is
        an ``nn.Sequential`` of the two, as in mmengine).

        Defaults for the keys ``cfg`` does not give come two ways, usable together:
        ``default_args=dict(optimizer=opt)`` as in mmengine's ``Registry.build`` /
        ``build_from_cfg``, or plain keywords (``optimizer=opt``). ``cfg`` always wins over
        both; on a key given both ways the plain keyword wins, as in ``dict(default_args, **kwargs)``.
        As in mmengine, the defaults may carry the ``type`` when ``cfg`` has none; a ``type``
        in the defaults is never passed to the constructor.

        A ``_scope_`` key (mmengine's registry scope, ``_scope_='mmdet'``), in ``cfg`` or in the
        defaults, is dropped: trainwright has one registry per kind, so the type is looked up there
        whatever the scope. If it, or a type its constructor builds, is unknown, the error says
        that the scope was ignored.

        ``default_args`` is always the defaults mapping, never a constructor argument; a class
        whose constructor takes a parameter named ``default_args`` gets it from ``cfg``
        (``dict(type=..., default_args=...)``) or from ``default_args=dict(default_args=...)``.
        """
        if self.build_func is not None:
            return self.build_func(cfg, registry=self, default_args=default_args, **kwargs)
        return build_from_cfg(cfg, self, default_args=default_args, **kwargs)

    def _build(
        self, cfg: Mapping[str, Any] | Any, default_args: Mapping[str, Any] | None, kwargs: dict[str, Any]
    ) -> Any:
        if isinstance(cfg, list) and self._build_list is not None:
            return self._build_list([self.build(item, default_args=default_args, **kwargs) for item in cfg])
        if not isinstance(cfg, Mapping):
            return cfg
        if default_args is None:
            defaults: dict[str, Any] = kwargs
        elif isinstance(default_args, Mapping):
            defaults = {**default_args, **kwargs}
        else:
            raise TypeError(
                f"{self.name} build: default_args must be a mapping of defaults (or None), got "
                f"{type(default_args).__name__}; "
                "to pass a constructor argument named 'default_args', put it in the config or use "
                "default_args=dict(default_args=...)"
            )
        if "type" in cfg:
            typ = cfg["type"]
        elif "type" in defaults:
            typ = defaults["type"]
        else:
            given = f"config keys {sorted(cfg)}" + (
                f" and default keys {sorted(defaults)}" if defaults else " and no default_args"
            )
            raise KeyError(
                f"A {self.name} config needs a 'type' key, in the config or in default_args; got {given}; e.g. "
                "dict(type=..., ...)"
            )
        args = {k: v for k, v in cfg.items() if k != "type"}
        for k, v in defaults.items():
            if k != "type":
                args.setdefault(k, v)
        with dropping_scope(args):
            try:
                cls = self.get(typ) if isinstance(typ, str) else typ
                try:
                    return cls(**args)
                except TypeError as e:
                    if getattr(e, "failed_config", None) is not None:
                        raise  # a nested build failed: its message is the precise one
                    hint = keyword_hint(cls, e, args)
                    raise TypeError(
                        f"Could not build {self.name} {getattr(cls, '__name__', cls)!r} from {dict(cfg)!r}: {e}{hint}"
                    ) from e
            except Exception as e:
                if getattr(e, "failed_config", None) is None:
                    # the innermost config that failed; Trainer.from_config turns it into a key path (model.backbone)
                    e.failed_config = cfg  # type: ignore[attr-defined]
                raise


def build_from_cfg(
    cfg: Mapping[str, Any] | Any, registry: Registry, default_args: Mapping[str, Any] | None = None, **kwargs: Any
) -> Any:
    """The default build of :meth:`Registry.build` (mmengine's ``build_from_cfg``): what a custom ``build_func``
    delegates to."""
    return registry._build(cfg, default_args, kwargs)  # noqa: SLF001


def import_modules_from_strings(imports: str | Sequence[str] | None, allow_failed_imports: bool = False) -> Any:
    """Import modules by name (mmengine's): one module for a str, a list for a list; None for a module that failed when
    allowed.

    Raises:
        ImportError: a module cannot be imported and ``allow_failed_imports`` is False.
        TypeError: ``imports`` is neither a str nor a list of str.
    """
    import importlib
    import warnings

    if not imports:
        return None
    single = isinstance(imports, str)
    names: list[Any] = [imports] if single else list(imports) if isinstance(imports, (list, tuple)) else []
    if not names or not all(isinstance(n, str) for n in names):
        raise TypeError(f"custom imports must be a str or a list of str, got {imports!r}")
    modules: list[Any] = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            if not allow_failed_imports:
                raise
            warnings.warn(
                f"{name} failed to import and is ignored (allow_failed_imports=True)", UserWarning, stacklevel=2
            )
            modules.append(None)
    return modules[0] if single else modules


@contextlib.contextmanager
def dropping_scope(args: dict[str, Any]) -> Iterator[Any]:
    """Drop mmengine's ``_scope_`` key from the config arguments ``args`` (in place; yields the scope, None if absent),
    and add to an unknown-type error raised inside that the scope is ignored.

    trainwright has one registry per kind, so a scope selects nothing: the type is looked up in that registry
    whatever the scope. An unknown-type ``KeyError`` (``Registry.get``'s) raised inside, for this config's type
    or for one built while building it, gets :func:`ignored_scope_hint`'s sentence naming the scope, unless the
    config of an inner build named its own (the innermost scope is the one mmengine would have used).

    The one place of this rule: :meth:`Registry.build` and the code that reads a config's ``type`` itself
    (``build_optim_wrapper``, ``DefaultOptimWrapperConstructor``, ``build_param_scheduler``, and
    ``Trainer.from_config`` for the typed loop configs) all go through it.
    """
    scope = args.pop("_scope_", None)
    try:
        yield scope
    except Exception as e:
        hint = ignored_scope_hint(
            e, "_scope_", scope
        )  # this type, or one its constructor builds, would have been looked up in that scope by mmengine
        if hint:
            e.args = (f"{e.args[0]}{hint}",)
        raise


def ignored_scope_hint(error: BaseException, key: str, scope: Any, *, subject: str | None = None) -> str:
    """The sentence an unknown-type ``error`` (``Registry.get``'s) gets when its config names an mmengine scope; "" when
    there is none to add.

    ``key`` is where the scope was given: ``"_scope_"``, ``"default_scope"`` (the sentence says
    "The config's <key>=<scope>"), or ``"type"`` for a scoped type name, with ``subject`` saying
    so. Nothing is added when ``scope`` is None, when ``error`` is not an unknown-type error, or
    when a scope already explained it (the innermost one, as mmengine would have used);
    otherwise the error is marked as explained by ``scope``.
    """
    typ = getattr(error, "unknown_type", None)
    if scope is None or typ is None or getattr(error, "ignored_scope", None) is not None:
        return ""
    error.ignored_scope = scope  # type: ignore[attr-defined]
    if subject is None:
        subject = f"The config's {key}={scope!r}"
    return (
        f" ({subject} is ignored: trainwright has one registry per kind, so {typ!r} must be registered in it by a "
        "module "
        f"the config imports, e.g. through custom_imports; the registries of {scope!r} are not searched.)"
    )


def _same_definition(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one class or function defined twice: same qualified name, and same module or source
    file.

    A config file loaded twice, or loaded by ``Config.fromfile`` and also imported as a module, defines its classes
    again.
    """
    qualname = getattr(a, "__qualname__", None)
    if qualname is None or qualname != getattr(b, "__qualname__", None):
        return False
    if getattr(a, "__module__", None) == getattr(b, "__module__", None):
        return True
    files = [getattr(sys.modules.get(getattr(o, "__module__", None) or ""), "__file__", None) for o in (a, b)]
    return files[0] is not None and files[1] is not None and os.path.realpath(files[0]) == os.path.realpath(files[1])


#: A name this similar to a known one (difflib's ratio) is a typo of it, refused rather than taken as something else:
#: measured on
#: config keys, typos score 0.86 and up ('optim_wraper' 0.96, 'trian_cfg' 0.89, 'val_cgf' 0.86, 'backbon.0' for
#: 'backbone.0' 0.95)
#: and mmengine's helper variables 0.81 and down ('gallery_dataloader', 'train_dataset' 0.76, 'tta_model' 0.71,
#: 'optimizer' 0.64).
TYPO_CUTOFF = 0.85


def did_you_mean(key: str, options: list[str] | Any, cutoff: float = 0.6) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest of ``options`` (``difflib`` similarity at least ``cutoff``),
    or ``""``."""
    options = [str(o) for o in options]
    lowered: dict[str, str] = {}
    for o in options:
        lowered.setdefault(o.lower(), o)
    # compared case-insensitively ('Adamw' means 'AdamW'), an exact match up to case first
    close = [lowered[c] for c in difflib.get_close_matches(key.lower(), list(lowered), n=3, cutoff=cutoff)]
    if key.lower() in lowered:
        close = [lowered[key.lower()], *[c for c in close if c != lowered[key.lower()]]]
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def accepted_kwargs(obj: Any) -> set[str] | None:
    """The keyword names ``obj(...)`` accepts (a class: its ``__init__``, following ``*args/**kwargs`` mixins up the
    MRO); None if unknown."""
    if not isinstance(obj, type):
        try:
            params = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):
            return None
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    names: set[str] = set()
    for klass in obj.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            return None
        names.update(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self")
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


_UNEXPECTED = re.compile(r"unexpected keyword argument '(\w+)'")


def keyword_hint(obj: Any, error: TypeError, args: Mapping[str, Any]) -> str:
    """For a constructor's "unexpected keyword argument 'x'" ``error``: ``" Did you mean 'y'? It accepts: ..."``, else
    ``""``.

    Only when ``x`` is one of the config's ``args`` and not a keyword ``obj`` accepts (a
    TypeError raised deeper inside the constructor is left as it is).
    """
    m = _UNEXPECTED.search(str(error))
    accepted = accepted_kwargs(obj)
    if m is None or accepted is None or m.group(1) not in args or m.group(1) in accepted:
        return ""
    options = sorted(accepted - {"params", "optimizer"})
    return f".{did_you_mean(m.group(1), options)} {getattr(obj, '__name__', obj)} accepts: {', '.join(options)}."


def check_keys(
    what: str, cfg: Mapping[str, Any] | Any, allowed: Any, error: type[Exception] = KeyError, hint: str | None = None
) -> None:
    """Raise ``error`` for the first key of ``cfg`` not in ``allowed``, naming it, the closest match and the choices.

    The one "unknown key, did you mean" check every config-shaped argument goes through.

    Args:
        what: What the keys configure, for the message (``"train_cfg"``, ``"optim_wrapper"``).
        cfg: A mapping (its keys are checked) or an iterable of keys.
        allowed: The accepted keys.
        error: The exception type (``KeyError`` for config dicts, ``ValueError`` for argument values).
        hint: What to say after the close match; by default ``"Allowed: [...]"``.
    """
    options = sorted(allowed)
    for key in cfg:
        if key not in allowed:
            raise error(
                f"Unknown {what} key {key!r}.{did_you_mean(str(key), options)} "
                + (hint if hint is not None else f"Allowed: {options}")
            )


def _torch_optimizer(name: str) -> Any:
    import torch.optim

    obj = getattr(torch.optim, name, None)
    if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer):
        return obj
    return None


def _torch_optimizer_names() -> list[str]:
    import torch.optim

    return [
        n
        for n in dir(torch.optim)
        if isinstance(getattr(torch.optim, n), type)
        and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
        and n != "Optimizer"
    ]


_torch_optimizer.names = _torch_optimizer_names  # type: ignore[attr-defined]


def _located(modules: Mapping[str, str]) -> dict[str, str]:
    """``{"module": "NameA NameB"}`` -> ``{"NameA": "module", "NameB": "module"}``."""
    return {name: module for module, names in modules.items() for name in names.split()}


#: Where each stock component registers: the registries import a component's module the first time its name is looked
#: up, so that ``HOOKS.build(dict(type="LoggerHook"))`` works after ``import trainwright.registry`` alone and a run
#: loads only the components it builds (a default run never loads the FSDP, DeepSpeed, EMA or SWA code). A stock
#: component registered anywhere else is missing here: ``tests/test_registry.py`` imports every module and checks.
_SCHEDULERS = "trainwright.optim.scheduler."
STOCK_LOCATIONS: dict[str, dict[str, str]] = {
    "optim wrapper": _located(
        {
            "trainwright.optim.optim_wrapper": "OptimWrapper AmpOptimWrapper",
            "trainwright.optim.optim_wrapper_dict": "OptimWrapperDict",
        }
    ),
    "optim wrapper constructor": _located({"trainwright.optim.constructor": "DefaultOptimWrapperConstructor"}),
    "param scheduler": _located(
        {
            _SCHEDULERS + "torch_scheduler": "TorchScheduler",
            _SCHEDULERS + "cosine_restart": "CosineRestartParamScheduler",
            _SCHEDULERS + "lambda_scheduler": "LambdaParamScheduler LambdaLR",
            _SCHEDULERS + "one_cycle": "OneCycleParamScheduler",
            _SCHEDULERS + "param_scheduler": "ConstantParamScheduler LinearParamScheduler StepParamScheduler "
            "MultiStepParamScheduler ExponentialParamScheduler CosineAnnealingParamScheduler PolyParamScheduler",
            _SCHEDULERS + "plateau": "ReduceOnPlateauParamScheduler",
            _SCHEDULERS + "lr_scheduler": "ConstantLR LinearLR StepLR MultiStepLR ExponentialLR CosineAnnealingLR "
            "PolyLR OneCycleLR CosineRestartLR ReduceOnPlateauLR",
            _SCHEDULERS + "momentum_scheduler": "ConstantMomentum LinearMomentum StepMomentum MultiStepMomentum "
            "ExponentialMomentum CosineAnnealingMomentum PolyMomentum CosineRestartMomentum ReduceOnPlateauMomentum",
        }
    ),
    "hook": _located(
        {
            "trainwright.hooks.checkpoint": "CheckpointHook",
            "trainwright.hooks.early_stopping": "EarlyStoppingHook",
            "trainwright.hooks.ema": "EMAHook",
            "trainwright.hooks.empty_cache": "EmptyCacheHook",
            "trainwright.hooks.export": "SafetensorsExportHook",
            "trainwright.hooks.flops": "FlopsHook",
            "trainwright.hooks.iter_timer": "IterTimerHook",
            "trainwright.hooks.memory": "MemorySnapshotHook",
            "trainwright.hooks.logger": "LoggerHook",
            "trainwright.hooks.norms": "NormsHook",
            "trainwright.hooks.param_scheduler": "ParamSchedulerHook",
            "trainwright.hooks.sync_buffers": "SyncBuffersHook",
            "trainwright.hooks.precise_bn": "PreciseBNHook",
            "trainwright.hooks.preemption": "PreemptionHook",
            "trainwright.hooks.profiler": "ProfilerHook",
            "trainwright.hooks.progress_bar": "ProgressBarHook",
            "trainwright.hooks.runtime_info": "RuntimeInfoHook",
            "trainwright.hooks.sampler_seed": "DistSamplerSeedHook",
            "trainwright.hooks.stall": "StallHook",
            "trainwright.hooks.swa": "SWAHook",
        }
    ),
    "metric": _located(
        {
            "trainwright.evaluation.torchmetrics_adapter": "TorchMetric",
            "trainwright.evaluation.metrics.accuracy": "Accuracy",
        }
    ),
    "strategy": _located(
        {
            "trainwright.strategies.single_device": "single SingleDeviceStrategy",
            "trainwright.strategies.ddp": "ddp DDPStrategy",
            "trainwright.strategies.fsdp": "fsdp FSDPStrategy",
            "trainwright.strategies.deepspeed": "deepspeed DeepSpeedStrategy",
        }
    ),
    "model": _located({"trainwright.model.data_preprocessor": "BaseDataPreprocessor NormalizingDataPreprocessor"}),
    "dataset": _located(
        {
            "trainwright.data.mixture": "Mixture",
            "trainwright.data.wrappers": "ConcatDataset RepeatDataset ClassBalancedDataset",
        }
    ),
    "function": _located({"trainwright.data.collate": "pseudo_collate default_collate"}),
}

OPTIMIZERS = Registry("optimizer", import_name="trainwright.registry.OPTIMIZERS", fallback=_torch_optimizer)
OPTIM_WRAPPERS = Registry(
    "optim wrapper", import_name="trainwright.registry.OPTIM_WRAPPERS", locations=STOCK_LOCATIONS["optim wrapper"]
)
OPTIM_WRAPPER_CONSTRUCTORS = Registry(
    "optim wrapper constructor",
    import_name="trainwright.registry.OPTIM_WRAPPER_CONSTRUCTORS",
    locations=STOCK_LOCATIONS["optim wrapper constructor"],
)
PARAM_SCHEDULERS = Registry(
    "param scheduler", import_name="trainwright.registry.PARAM_SCHEDULERS", locations=STOCK_LOCATIONS["param scheduler"]
)
HOOKS = Registry("hook", import_name="trainwright.registry.HOOKS", locations=STOCK_LOCATIONS["hook"])
METRICS = Registry("metric", import_name="trainwright.registry.METRICS", locations=STOCK_LOCATIONS["metric"])
STRATEGIES = Registry("strategy", import_name="trainwright.registry.STRATEGIES", locations=STOCK_LOCATIONS["strategy"])


def _sequential(modules: list[Any]) -> Any:
    from torch import nn

    return nn.Sequential(*modules)


MODELS = Registry(
    "model", import_name="trainwright.registry.MODELS", build_list=_sequential, locations=STOCK_LOCATIONS["model"]
)
DATASETS = Registry("dataset", import_name="trainwright.registry.DATASETS", locations=STOCK_LOCATIONS["dataset"])
#: Plain functions built by name (mmengine's ``FUNCTIONS``): ``collate_fn=dict(type='pseudo_collate')``.
FUNCTIONS = Registry("function", import_name="trainwright.registry.FUNCTIONS", locations=STOCK_LOCATIONS["function"])

__all__ = [
    "ConfigError",
    "Registry",
    "build_from_cfg",
    "import_modules_from_strings",
    "accepted_kwargs",
    "check_keys",
    "did_you_mean",
    "keyword_hint",
    "dropping_scope",
    "ignored_scope_hint",
    "OPTIMIZERS",
    "OPTIM_WRAPPERS",
    "OPTIM_WRAPPER_CONSTRUCTORS",
    "PARAM_SCHEDULERS",
    "HOOKS",
    "METRICS",
    "STRATEGIES",
    "MODELS",
    "DATASETS",
    "FUNCTIONS",
]
