"""Trainer: wires model, data, optimization, hooks and strategy; the loops do the work."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from trainwright.amp.precision import Precision
from trainwright.checkpoint import save_safetensors
from trainwright.checkpoint.lock import WorkDirBusyError
from trainwright.hooks.dispatch import HookList
from trainwright.hooks.hook import Hook
from trainwright.hooks.timing import HookTimer
from trainwright.logging.logger import close_logger
from trainwright.logging.writers import Writer, build_writers
from trainwright.loops.context import LoopContext
from trainwright.loops.train_loop import EpochBasedTrainLoop, IterBasedTrainLoop
from trainwright.model.base_model import ModuleAdapter, as_base_model
from trainwright.model.compile import check_static_batches
from trainwright.optim.builder import run_precision
from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.optim.spike_guard import SpikeGuard
from trainwright.registry import MODELS
from trainwright.strategies import build_strategy
from trainwright.trainer import restore, tuning_entry
from trainwright.trainer.build import TRAIN_PIECES, TrainSpec, build_eval_loop, build_train, loop_context, train_pieces
from trainwright.trainer.checkpoint_setup import build_checkpoints, checkpoint_record, checkpoint_settings
from trainwright.trainer.env_cfg import apply_env_cfg
from trainwright.trainer.hooks_config import build_hook, build_hooks, check_one_average
from trainwright.trainer.moved import moved_member, set_should_stop
from trainwright.trainer.rank_check import check_ranks_agree
from trainwright.trainer.restore import PendingRestore, nothing_to_train
from trainwright.trainer.run_config import run_config
from trainwright.trainer.run_facts import message_hub
from trainwright.trainer.run_guard import RunGuard
from trainwright.trainer.runs import run_name
from trainwright.trainer.seeding import RunSeed, torch_seeded
from trainwright.trainer.state import DataOrderState
from trainwright.trainer.wiring import add_spike_guard, build_logging, checked_cfgs, log_hook_table
from trainwright.tuning.lr_range import LRRange
from trainwright.utils.progress import Progress


class Trainer:
    """Runs training, validation and testing of a model: builds and wires the parts; the loops, hooks and strategy
    do the work.

    The arguments most runs give (every argument is described in docs/guide.md, "The Trainer"):

    Args:
        model: A :class:`~trainwright.BaseModel`, a plain ``nn.Module`` whose forward returns a loss tensor or a dict
            of losses, or ``dict(type=...)`` of ``trainwright.registry.MODELS`` (built after the Trainer seeded).
        work_dir: Where checkpoints (``checkpoints/``) and run folders (``train.log``, ``metrics.jsonl``) go.
        train_dataloader: A ``DataLoader`` or a dict of its arguments (``val_dataloader`` / ``test_dataloader`` too).
        train_cfg: ``dict(by_epoch=True, max_epochs=...)`` or ``dict(by_epoch=False, max_iters=...)``.
        optim_wrapper: An OptimWrapper or ``dict(optimizer=dict(type="SGD", lr=...))``.
    """

    def __init__(
        self,
        model: nn.Module | Mapping[str, Any],
        work_dir: str | Path = "work_dirs/default",
        train_dataloader: Any = None,
        val_dataloader: Any = None,
        test_dataloader: Any = None,
        train_cfg: Mapping[str, Any] | None = None,
        val_cfg: Mapping[str, Any] | None = None,
        test_cfg: Mapping[str, Any] | None = None,
        optim_wrapper: Any = None,
        param_scheduler: Any = None,
        val_evaluator: Any = None,
        test_evaluator: Any = None,
        default_hooks: Mapping[str, Any] | None = None,
        custom_hooks: Sequence[Hook | Mapping[str, Any]] | None = None,
        precision: str | Precision = "32",
        strategy: Any = "auto",
        compile: bool | Mapping[str, Any] = False,
        activation_checkpointing: Sequence[type[nn.Module] | str] | str | None = None,
        resume: bool | str | Path = False,
        load_from: str | Path | None = None,
        randomness: Mapping[str, Any] | None = None,
        nonfinite_loss: str = "raise",
        log_level: str | int = "INFO",
        experiment_name: str | None = None,
        writers: Sequence[Writer | str | Mapping[str, Any]] | None = None,
        writers_fail: str = "warn",
        hook_timing: bool | None = None,
        env_cfg: Mapping[str, Any] | None = None,
        spike_guard: Mapping[str, Any] | SpikeGuard | None = None,
        checkpoint: Mapping[str, Any] | None = None,
    ) -> None:
        given = dict(locals())  # the arguments by name, first: what the config records (trainer/run_config.py)
        # read before the Trainer seeds: whether a model given built was drawn from an unseeded generator
        built_unseeded = not isinstance(model, Mapping) and not torch_seeded()
        train_cfg, val_cfg, test_cfg = checked_cfgs(nonfinite_loss, writers_fail, train_cfg, val_cfg, test_cfg)
        guard = SpikeGuard.build(spike_guard)  # checked before anything is created too
        skip_nonfinite = nonfinite_loss == "skip"
        #: What the train parts are built from (train_cfg, the loader, optim wrapper and scheduler configs as given).
        self._train = TrainSpec(train_cfg, train_dataloader, optim_wrapper, param_scheduler, skip_nonfinite, guard)
        work_dir = Path(work_dir)
        self.strategy = build_strategy(strategy)
        # the run's one precision (the strategy prepares the model with it; a plain optim wrapper uses it), resolved
        # first: a precision this machine cannot run (float8 without its GPU) fails before anything is created
        self.strategy.precision = run_precision(optim_wrapper, precision or "32", self.strategy.device.type)
        self.strategy.setup_env(randomness=randomness, **apply_env_cfg(self.strategy, env_cfg))
        # a model dict is built now, after the seed: its initial weights follow randomness's seed
        module: nn.Module = MODELS.build(model) if isinstance(model, Mapping) else model
        # the hooks are built before the run folder: a remote out_dir (checkpoints, logs) is checked first, so a bad URL
        # leaves no folder
        hooks = build_hooks(default_hooks, custom_hooks, train_cfg)
        ckpt_settings = checkpoint_settings(checkpoint, hooks, train_cfg)  # checked before anything is created
        name = run_name(self.strategy, work_dir, experiment_name)  # rank 0 creates a new one
        self._run_dir_created = experiment_name is None  # this trainer made the folder (not an earlier run's)
        #: Runs the loops between ``before_run`` and the clean-up, and reports what stopped a run.
        self._runs = RunGuard(self)
        #: This run's folder (``work_dir/<experiment_name>``): ``train.log``, ``metrics.jsonl``, the config, traces.
        self.run_dir = work_dir / name
        logs = build_logging(self.strategy, self.run_dir, log_level, writers, writers_fail, hooks, nonfinite_loss)
        # the metric store (the run's agreement: stop / NaN / write decisions) and the log lines held for batched
        # writing (the logger hook fills them, flush_logs writes them; their writers: the one fan-out point)
        self.logger, self.metric_store, self.log_lines = logs
        self.metric_store.clipping = lambda: any(  # the NaN error's advice
            getattr(ow, "clip_grad", None) for ow in optim_wrappers_of(self.optim_wrapper).values()
        )
        self.progress = Progress()
        config = run_config(given, name, self.strategy)
        #: The trainer's settings as plain values (written to the writers and into every checkpoint's ``meta``).
        self.config: dict[str, Any] = config
        seeded = bool(randomness and randomness.get("seed") is not None)
        self._seed = RunSeed(self.strategy, seeded, config, self.logger)
        self._seed.note_model_seeding(built_unseeded, load_from)
        #: mmengine's message hub: the run's facts read live, the logged scalars, what hooks and models write.
        self.message_hub = message_hub(name, self.progress, self._seed, lambda: self.train_loop, self.metric_store)
        self.log_lines.writers.write_config(config)
        self.hooks = HookList(hooks, timer=HookTimer() if hook_timing is not False else None)
        add_spike_guard(guard, self.hooks, self.progress, logs, self.strategy)
        self._hook_timing = hook_timing  # the table after train()
        self._compile = compile
        ac = activation_checkpointing
        self._activation_checkpointing = [ac] if isinstance(ac, (str, type)) else list(ac or ())
        # the strategy moves (once), compiles and wraps it when a run first needs it
        self.model: nn.Module = as_base_model(module)
        self.optim_wrapper: Any = None
        self.param_schedulers: Any = None
        self.train_loop: EpochBasedTrainLoop | IterBasedTrainLoop | None = None
        self.val_loop = build_eval_loop(self.strategy, val_dataloader, val_evaluator, "val", val_cfg)
        self.test_loop = build_eval_loop(self.strategy, test_dataloader, test_evaluator, "test", test_cfg)
        self._prepared = False
        self._restore = PendingRestore(  # resume applies to a trainer that trains
            resume,
            load_from,
            trains=train_dataloader is not None and optim_wrapper is not None,
            config=config,
            progress=self.progress,
            logger=self.logger,
            load_weights=self.load_weights,
        )
        #: The checkpoints: saving, naming, ``latest``, keep-k, restore, the folder's lock (hooks reach it here).
        self.checkpoints = build_checkpoints(
            self.strategy,
            work_dir,
            ckpt_settings,
            checkpoint_record(hooks),
            progress=self.progress,
            config=config,
            seed=self._seed,
            metric_store=self.metric_store,
            message_hub=self.message_hub,
            hooks=self.hooks,
            logger=self.logger,
            flush=self._flush_before_save,
            events=self.hooks.checkpoint_events(self),
        )

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], **overrides: Any) -> Trainer:
        """Build a trainer from a config: a :class:`~trainwright.config.Config` (``Config.fromfile(path)``) or a dict
        of this constructor's arguments; ``overrides`` replace its keys (``work_dir=...``).

        See :func:`trainwright.trainer.from_config.trainer_from_config` and docs/config.md.
        """
        from trainwright.trainer.from_config import trainer_from_config

        return trainer_from_config(cls, cfg, **overrides)

    # -- properties -----------------------------------------------------------------------
    @property
    def unwrapped_model(self) -> nn.Module:
        """The user's model: without DDP/FSDP wrappers and without the plain-module adapter."""
        model = self.unwrapped_base
        return model.module if isinstance(model, ModuleAdapter) else model

    @property
    def prepared(self) -> bool:
        """True while the strategy holds the model prepared for runs (moved, compiled, wrapped); :meth:`close` undoes
        it."""
        return self._prepared

    @property
    def should_stop(self) -> bool:
        """Whether training ends after the current iteration (or pass), the same on every process (the loop's flag).

        Setting it True is the deprecated spelling (Lightning's, mmengine users') of
        ``trainer.train_loop.control.request_stop(reason)``, which it calls while training runs: a request
        that the ranks agree on at the next agreement point (see :class:`~trainwright.loops.control.RunControl`).
        """
        return self.metric_store.agreement.finish

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        set_should_stop(value, self.train_loop, self.metric_store.agreement)  # deprecated (see trainer/moved.py)

    @property
    def precision(self) -> Precision:
        """The run's precision (``trainer.strategy.precision``): autocast, GradScaler; the optim wrapper's own when
        it is mixed."""
        return self.strategy.precision

    # -- building -------------------------------------------------------------------------
    def _build_train(self) -> None:
        """Build the train loader, optim wrapper (over the prepared model), train loop and schedulers, once (see
        :mod:`trainwright.trainer.build`)."""
        if self.train_loop is not None:
            return
        self._prepare_model()
        parts = build_train(self.strategy, self.hooks, self._train, model=self.unwrapped_base, seed=self._seed.value)
        self.optim_wrapper, self.strategy.precision, self.train_loop, self.param_schedulers = parts
        self._data_order = DataOrderState(self.train_loop.dataloader, self.progress, self.logger)
        self._seed.follow(self.train_loop.dataloader)
        self.strategy.setup_optim_wrapper(self.optim_wrapper)
        self.model = self.strategy.model  # type: ignore[assignment]  # a strategy whose wrapper needs the optimizer (DeepSpeed) made it now
        self.checkpoints.pieces.update(train_pieces(self.strategy, parts, self._data_order))

    def build_train_loop(self) -> EpochBasedTrainLoop | IterBasedTrainLoop:
        """Build what ``train()`` builds first (train loader, optim wrapper over the prepared model, loop, schedulers),
        once; return the loop.

        ``train()`` calls it; calling it earlier gives hooks and scripts the loop before training
        (mmengine's ``runner.train_loop``, built on first access). Restoring ``resume`` / ``load_from`` stays
        ``train()``'s.
        """
        self._build_train()
        assert self.train_loop is not None
        return self.train_loop

    @property
    def unwrapped_base(self) -> nn.Module:
        """The BaseModel the loops call, without distributed wrappers."""
        return self.strategy.unwrap_model(self.model) if self._prepared else self.model

    def _prepare_model(self) -> None:
        """Have the strategy move, compile and wrap (or shard) the model, once."""
        if not self._prepared:
            check_static_batches(self._compile, self._train.loader_cfg)
            self.model = self.strategy.prepare(
                self.model, compile=self._compile, activation_checkpointing=self._activation_checkpointing
            )
            self._prepared = True

    def _build_and_prepare(self) -> None:
        self._build_train()
        self._prepare()

    def _prepare(self) -> None:
        """The model prepared, then ``resume`` / ``load_from`` applied if due (a pass before ``train()`` restores
        what exists; ``train()`` again, with its optimizer)."""
        self._prepare_model()
        self._restore.apply(self.checkpoints, train_built=self.train_loop is not None)

    # -- hooks ----------------------------------------------------------------------------
    def register_hook(self, hook: Hook | Mapping[str, Any], priority: int | str | None = None) -> Hook:
        """Add a hook, as ``custom_hooks`` would (mmengine's ``Runner.register_hook``).

        Args:
            hook: A :class:`Hook` or a dict with ``type`` (and optionally ``priority``).
            priority: Replaces the hook's own priority (a number 0..100 or a name).

        Returns:
            The hook, in the trainer's hook list. Register before ``train()`` to get every event;
            a hook registered while training runs gets per-iteration events from the next epoch.
        """
        built = build_hook(hook, priority)
        self.hooks.add(built)
        if (record := built.checkpoint_record()) is not None:  # a checkpoint hook: saves are recorded in its state
            self.checkpoints.configure(record=record)
        if self.strategy.is_main_process:  # a writer the hook brings (the progress bar's) joins, as at build
            self.log_lines.writers.extend(build_writers([], self.run_dir, self.logger, [built]))
        return built

    # -- running --------------------------------------------------------------------------
    def train(self) -> nn.Module:
        """Run the training loop (validating as configured); return the trained model.

        Raises:
            WorkDirBusyError: another live process (or Trainer) is training in this ``work_dir``
                (the message names its pid); nothing was read or written.
        """
        try:
            self.checkpoints.lock()
        except WorkDirBusyError:
            self._runs.remove_unused_folder(created=self._run_dir_created)
            raise
        self.strategy.run_failed = False
        try:
            check_one_average(self.hooks)
            self._build_and_prepare()
            assert self.train_loop is not None
            # one collective: every rank's settings, data shape and resumed checkpoint
            check_ranks_agree(self.strategy, self.config, self.train_loop.dataloader, self.checkpoints.restored)
            self.metric_store.agreement.set_finish(False)
            loop = self.train_loop
            if (done := nothing_to_train(self.progress, loop.max_iters, self._data_order.shape_change)) is not None:
                self.logger.warning(done)
            self._runs.run(partial(loop.run, self._loop_context()))
        except BaseException as e:
            self._runs.failed_outside_a_run(e)
            raise
        finally:
            self.checkpoints.unlock()
        log_hook_table(self.hooks, self.logger, self._hook_timing)
        return self.unwrapped_model

    def val(self) -> dict[str, float]:
        """One validation pass; returns metrics like ``{"val/acc": 0.97}``.

        Under several processes call it on every process, as ``train()``: each evaluates its
        shard and the results are gathered (a call on rank 0 alone waits in that gather).
        """
        return self._eval_pass(self.val_loop, "val() needs a val_dataloader (and usually a val_evaluator)")

    def test(self) -> dict[str, float]:
        """One test pass; returns metrics like ``{"test/acc": 0.97}``; under several processes, on every process (see
        :meth:`val`)."""
        return self._eval_pass(self.test_loop, "test() needs a test_dataloader (and usually a test_evaluator)")

    def _eval_pass(self, loop: EvalLoop | None, missing: str) -> dict[str, float]:
        if loop is None:
            raise ValueError(missing)
        self._prepare()
        self.metric_store.agreement.set_finish(False)  # a stop request of an earlier run does not cut this pass
        return self._runs.run(partial(loop.run, self._loop_context()))

    # -- tuning (the work is trainer/tuning_entry.py's and trainwright.tuning's) ---------------
    def find_lr(
        self,
        min_lr: float = LRRange.min_lr,
        max_lr: float = LRRange.max_lr,
        num_steps: int = LRRange.num_steps,
        mode: str = LRRange.mode,
        smooth: float = LRRange.smooth,
        diverge: float | None = LRRange.diverge,
    ) -> LRFinderResult:
        """The learning-rate range test (Lightning's ``Tuner.lr_find``); the trainer is left bitwise as it was.

        See :func:`trainwright.trainer.tuning_entry.find_lr` and docs/diagnose.md.
        """
        return tuning_entry.find_lr(self._tuning(), LRRange(min_lr, max_lr, num_steps, mode, smooth, diverge))

    def find_batch_size(
        self, mode: str = "power", init: int = 2, max_trials: int = 25, steps_per_trial: int = 3, apply: bool = False
    ) -> int:
        """The largest batch size per process that ``steps_per_trial`` training steps fit in device memory (CUDA).

        See :func:`trainwright.trainer.tuning_entry.find_batch_size` and docs/diagnose.md.
        """
        return tuning_entry.find_batch_size(self._tuning(), mode, init, max_trials, steps_per_trial, apply)

    def verify_resume(
        self,
        steps: int | None = None,
        at: Sequence[int] | None = None,
        nproc: int = 1,
        work_dir: str | Path | None = None,
        config: str | Path | None = None,
    ) -> ResumeReport:
        """Train this trainer's config uninterrupted and restarted in fresh processes at ``at``; compare bitwise.

        ``config`` defaults to the one ``Trainer.from_config`` wrote into the run folder. See
        :func:`trainwright.verify.verify_resume` and docs/checkpoints.md#verifying-resume.
        """
        from trainwright.verify.resume import config_of_run, verify_resume

        cfg = config if config is not None else config_of_run(self.run_dir)
        return verify_resume(cfg, steps=steps, at=at, nproc=nproc, work_dir=work_dir)

    def _tuning(self) -> tuning_entry.TuningAccess:
        return tuning_entry.TuningAccess(
            self,
            self.progress,
            self._runs.refuse_inside_run,
            self._build_and_prepare,
            self._train.loader_cfg,
            self._use_train_loader,
        )

    def _use_train_loader(self, loader_cfg: Any) -> None:
        """Train with ``loader_cfg`` from the next :meth:`train` on: the train parts are built again for it."""
        self._train.loader_cfg = loader_cfg
        self.train_loop = self.optim_wrapper = self.param_schedulers = None
        self._seed.follow(None)
        self.checkpoints.pieces.update(dict.fromkeys(TRAIN_PIECES))

    def _loop_context(self) -> LoopContext:
        """What the loops use in one run (the model as prepared); the eval loops hold it from the start, so a hook
        can call ``run_pass`` at any event."""
        return loop_context(
            self,
            self.model,
            self.hooks,
            self.progress,
            self.optim_wrapper,
            self.metric_store,
            self.precision,
            self.logger,
            (self.val_loop, self.test_loop),
        )

    # -- checkpoints (the work is self.checkpoints': checkpoint/manager.py) -------------------
    def resume_from(self, path: str | Path) -> None:
        """Load a full checkpoint now (builds the train loop and model first); ``train()`` continues from it."""
        self._build_train()
        self._restore.resume_from(path)
        self._prepare()

    def load_weights(
        self, path: str | Path, strict: bool = False, revise_keys: Sequence[tuple[str, str]] = ((r"^module\.", ""),)
    ) -> Any:
        """Load model weights (``.pth`` or ``.safetensors``), reporting key mismatches by name; returns the missing and
        unexpected keys.

        Args:
            path: The weights, or a checkpoint holding them under ``"model"`` / ``"state_dict"``.
            strict: Whether missing or unexpected keys are an error (they are always listed).
            revise_keys: ``(pattern, replacement)`` key renames applied first (default: drop DDP's ``module.``).
        """
        return restore.load_weights(
            self.unwrapped_model,
            self.strategy,
            path,
            prepared=self.prepared,
            within=self.checkpoints.ckpt_dir,
            strict=strict,
            revise_keys=list(revise_keys),
            logger=self.logger,
        )

    def save_weights(self, path: str | Path) -> Path:
        """Export the full model weights as safetensors (the model's own keys; gathered to rank 0 under FSDP; call it
        on every rank)."""
        state = self.strategy.full_model_state_dict() if self.prepared else self.unwrapped_model.state_dict()
        if self.strategy.is_main_process:
            save_safetensors(state, path)
        return Path(path)

    # -- logs -----------------------------------------------------------------------------
    def flush_logs(self) -> None:
        """Make everything logged so far visible on disk (log lines still pending, log file, ``metrics.jsonl``).

        Raises:
            FloatingPointError: a loss logged since the last flush is NaN/Inf (see ``nonfinite_loss``).
        """
        self.metric_store.flush()
        self.log_lines.write()
        self.log_lines.writers.flush()
        for h in self.logger.handlers:
            h.flush()

    def _flush_before_save(self) -> None:
        """:meth:`flush_logs` before a checkpoint is written: a writer's error (``writers_fail="raise"``) waits until
        the checkpoint exists."""
        with self.log_lines.writers.holding():
            self.flush_logs()

    if not TYPE_CHECKING:  # to mypy a Trainer has only its own members

        def __getattr__(self, name: str) -> Any:
            """Members that moved keep their old names for a while (see :mod:`trainwright.trainer.moved`)."""
            return moved_member(self, name)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:  # left by an exception: other processes may be anywhere, so no collective at teardown
            self.strategy.run_failed = True
        self.close()

    def close(self) -> None:
        """Close the writers and the log file; release the strategy's resources (its model wrapper, a pending checkpoint
        write; a process group it made for this run only, not a launcher's, which later Trainers of the process join).

        Under several processes the ranks wait for each other here, unless the last run (or the
        ``with`` block) ended by an exception: then no collective is made, so the other ranks'
        collectives fail as soon as this process exits instead of waiting for the timeout.
        """
        self.checkpoints.unlock()
        self.log_lines.writers.close()
        close_logger(self.logger)
        if self._prepared:
            self.model = self.unwrapped_base  # drop the distributed wrapper before the strategy leaves its group
            self._prepared = False
        self.strategy.teardown()


if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView
    from trainwright.loops.eval_loop import EvalLoop
    from trainwright.tuning.lr_finder import LRFinderResult
    from trainwright.verify.compare import ResumeReport

    def _trainer_is_a_view(trainer: Trainer) -> TrainerView:
        return trainer  # mypy checks that the Trainer offers everything hooks are typed against
