"""``Runner``: mmengine's ``Runner`` constructor, ``from_cfg`` and attributes, as a thin layer over
:class:`~trainwright.Trainer`.

A script written against mmengine's Runner runs by changing its imports: its keyword
arguments are translated once, here, into the Trainer's (the same translation
``Trainer.from_config`` applies to config files, :func:`~trainwright.trainer.from_config.trainer_arguments`);
hooks receive the Runner itself, so ``runner.epoch``, ``runner.iter``, ``runner.train_loop``
(built with the runner, as mmengine builds it on first access) and the rest read as in mmengine.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from trainwright.dist import detect_launcher
from trainwright.trainer import Trainer
from trainwright.trainer.from_config import dump_config, trainer_arguments, trainer_keys

#: mmengine's ``launcher`` values.
LAUNCHERS = ("none", "pytorch", "slurm", "mpi")


class Runner(Trainer):
    """mmengine's ``Runner``: its keyword arguments, :meth:`from_cfg`, ``train()`` / ``val()`` / ``test()``.

    Every argument means what it means in mmengine; dicts are translated as a config file's
    (``sampler=dict(type='DefaultSampler', shuffle=True)`` → a sharded, resumable shuffle;
    ``collate_fn=dict(type='default_collate')``; loop types; ``visualizer`` / ``log_processor``
    → writers and the logger hook; ``auto_scale_lr``; a top-level ``data_preprocessor``).
    Anything else a :class:`~trainwright.Trainer` takes (``precision=``, ``strategy=``...)
    may be given too.

    Args:
        model: An ``nn.Module`` (a :class:`~trainwright.BaseModel`) or ``dict(type=...)`` of ``MODELS``.
        work_dir: Where checkpoints and run folders go.
        launcher: How the processes were started: ``"none"`` (one process), ``"pytorch"``
            (torchrun), ``"slurm"`` (srun), ``"mpi"`` (mpirun). The strategy follows what
            the launcher started (DDP over several processes); a value that disagrees with the
            environment is refused, naming what was detected.
        env_cfg: mmengine's ``env_cfg`` (cudnn, multiprocessing, ``dist_cfg``); None: defaults.
        default_scope: mmengine's registry scope; trainwright has one registry per kind, so
            it is accepted and only ``"mmengine"`` (mmengine's default) passes silently.
        cfg: The config the runner came from (:meth:`from_cfg`), kept as :attr:`cfg` and written
            into the run folder.
        **trainer_kwargs: Further :class:`~trainwright.Trainer` arguments.

    Raises:
        ValueError: ``launcher`` is not one of mmengine's, or disagrees with how this process was started.
        ConfigError: an argument that does not translate (as for a config file).
    """

    def __init__(
        self,
        model: nn.Module | Mapping[str, Any],
        work_dir: str | Path,
        train_dataloader: Any = None,
        val_dataloader: Any = None,
        test_dataloader: Any = None,
        train_cfg: Mapping[str, Any] | None = None,
        val_cfg: Mapping[str, Any] | None = None,
        test_cfg: Mapping[str, Any] | None = None,
        auto_scale_lr: Mapping[str, Any] | None = None,
        optim_wrapper: Any = None,
        param_scheduler: Any = None,
        val_evaluator: Any = None,
        test_evaluator: Any = None,
        default_hooks: Mapping[str, Any] | None = None,
        custom_hooks: Sequence[Any] | None = None,
        data_preprocessor: Mapping[str, Any] | None = None,
        load_from: str | Path | None = None,
        resume: bool | str | Path = False,
        launcher: str = "none",
        env_cfg: Mapping[str, Any] | None = None,
        log_processor: Mapping[str, Any] | None = None,
        log_level: str | int = "INFO",
        visualizer: Mapping[str, Any] | None = None,
        default_scope: str | None = "mmengine",
        randomness: Mapping[str, Any] | None = None,
        experiment_name: str | None = None,
        cfg: Mapping[str, Any] | None = None,
        **trainer_kwargs: Any,
    ) -> None:
        _check_launcher(launcher)
        given = dict(
            model=model,
            work_dir=work_dir,
            train_dataloader=train_dataloader,
            val_dataloader=val_dataloader,
            test_dataloader=test_dataloader,
            train_cfg=train_cfg,
            val_cfg=val_cfg,
            test_cfg=test_cfg,
            auto_scale_lr=auto_scale_lr,
            optim_wrapper=optim_wrapper,
            param_scheduler=param_scheduler,
            val_evaluator=val_evaluator,
            test_evaluator=test_evaluator,
            default_hooks=default_hooks,
            custom_hooks=custom_hooks,
            data_preprocessor=data_preprocessor,
            load_from=load_from,
            resume=resume,
            env_cfg=env_cfg,
            log_processor=log_processor,
            log_level=log_level,
            visualizer=visualizer,
            randomness=randomness,
            experiment_name=experiment_name,
            default_scope=None if default_scope == "mmengine" else default_scope,
            **trainer_kwargs,
        )
        if isinstance(val_cfg, Mapping) and not val_cfg and val_dataloader is None:
            given["val_cfg"] = None  # mmengine's val_cfg=dict() without a loader: no validation
        args = {k: v for k, v in given.items() if v is not None}
        built = trainer_arguments(args, trainer_keys(Trainer))
        #: The launcher the processes were started by (mmengine's ``runner.launcher``).
        self.launcher = launcher
        #: The config this runner was built from (mmengine's ``runner.cfg``); None when built from arguments.
        self.cfg = cfg
        super().__init__(**built.kwargs)
        if built.scaled:
            self.logger.info(built.scaled)
        if train_dataloader is not None and optim_wrapper is not None:
            # mmengine's runner.train_loop exists before train(): hooks and scripts read it (max_iters...) early
            self.build_train_loop()
        if cfg is not None and self.strategy.is_main_process:
            dump_config(cfg, self.run_dir)

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any]) -> Runner:
        """mmengine's ``Runner.from_cfg``: a runner of the config's keys that are Runner arguments (others are the
        config's helper variables).

        Prefer :meth:`~trainwright.Trainer.from_config` for new code: it also refuses a key
        that looks like a misspelt argument.
        """
        names = set(inspect.signature(cls.__init__).parameters) - {"self", "cfg", "trainer_kwargs"}
        names |= set(trainer_keys(Trainer))
        kwargs = {k: v for k, v in cfg.items() if k in names}
        kwargs.setdefault("work_dir", "work_dirs/default")
        return cls(**kwargs, cfg=cfg)

    # -- mmengine's attributes ----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """Epochs completed (mmengine's ``runner.epoch``)."""
        return self.progress.epoch

    @property
    def iter(self) -> int:
        """Iterations completed (mmengine's ``runner.iter``)."""
        return self.progress.iteration

    @property
    def max_epochs(self) -> int:
        """The train loop's epochs (mmengine's ``runner.max_epochs``)."""
        return int(getattr(self.train_loop, "max_epochs", 1 if self.train_loop is not None else 0))

    @property
    def max_iters(self) -> int:
        """The train loop's iterations (mmengine's ``runner.max_iters``; 0 before a train loop exists)."""
        return self.train_loop.max_iters if self.train_loop is not None else 0

    @property
    def seed(self) -> int:
        """The run's random seed (mmengine's ``runner.seed``; a resumed run that gave none takes its checkpoint's)."""
        return int(self.strategy.seed or 0)

    @property
    def work_dir(self) -> Path:
        """mmengine's ``runner.work_dir``: where checkpoints and run folders go."""
        return self.run_dir.parent

    @property
    def experiment_name(self) -> str:
        """mmengine's ``runner.experiment_name``: the run folder's name."""
        return self.run_dir.name

    def save_checkpoint(
        self,
        out_dir: str | Path,
        filename: str,
        file_client_args: Any = None,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        meta: Mapping[str, Any] | None = None,
        by_epoch: bool = True,
        backend_args: Any = None,
    ) -> None:
        """mmengine's ``runner.save_checkpoint(out_dir, filename, ...)``: a training checkpoint as ``out_dir/filename``.

        Written as every trainwright checkpoint is (atomically, through the strategy), so it resumes exactly.
        ``meta`` is refused (a trainwright checkpoint records the run's position itself); ``file_client_args`` /
        ``backend_args`` are accepted and unused (give ``out_dir`` as a URL for object storage); ``by_epoch`` is
        mmengine's naming hint and changes nothing here.
        """
        if meta:
            raise ValueError(
                "Runner.save_checkpoint(meta=...) is not supported: a trainwright checkpoint records the epoch, the "
                "iteration and the seed itself; save extra state with a hook's state_dict() instead"
            )
        exclude = ("optim_wrapper",) * (not save_optimizer) + ("param_schedulers",) * (not save_param_scheduler)
        target = f"{str(out_dir).rstrip('/')}/{filename}" if "://" in str(out_dir) else Path(out_dir) / filename
        self.checkpoints.save(target, exclude=exclude)

    @property
    def train_dataloader(self) -> Any:
        """The train loop's data loader (the resumable loader it iterates), or None."""
        return self.train_loop.dataloader if self.train_loop is not None else None

    @property
    def val_dataloader(self) -> Any:
        """The validation loop's data loader, or None."""
        return self.val_loop.dataloader if self.val_loop is not None else None

    @property
    def test_dataloader(self) -> Any:
        """The test loop's data loader, or None."""
        return self.test_loop.dataloader if self.test_loop is not None else None

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.strategy.rank

    @property
    def world_size(self) -> int:
        """Number of processes."""
        return self.strategy.world_size

    @property
    def distributed(self) -> bool:
        """Whether several processes train together."""
        return self.strategy.world_size > 1

    @property
    def log_dir(self) -> Path:
        """This run's folder (mmengine's ``work_dir/<timestamp>``): its log and metrics."""
        return self.run_dir


def _check_launcher(launcher: str) -> None:
    """``launcher`` is mmengine's and agrees with how this process was started."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"Runner launcher={launcher!r}: use one of {list(LAUNCHERS)} (how the processes were started)")
    found = detect_launcher()
    if launcher != "none" and found != launcher:
        raise ValueError(
            f"Runner launcher={launcher!r} but this process was not started by it (detected: {found!r}); start the "
            "script with "
            "torchrun --nproc_per_node=N script.py (launcher='pytorch'), srun (launcher='slurm'), mpirun "
            "(launcher='mpi'), or pass launcher='none'"
        )
    if launcher == "none" and found != "none":
        raise ValueError(
            f"Runner launcher='none' but this process was started by a launcher ({found!r}): pass launcher={found!r}"
        )


__all__ = ["LAUNCHERS", "Runner"]
