"""CheckpointHook: the policy of when to save (periodic, last, best); ``trainer.checkpoints`` does the saving.

Storage settings it is given (``out_dir``, ``max_keep_ckpts``, ``async_save``, ``filename_tmpl``...) are
handed to the :class:`~trainwright.checkpoint.manager.CheckpointManager` by the Trainer when it builds it
(:attr:`~trainwright.hooks.Hook.checkpoint_settings`). The files it keeps (its :class:`SaveRecord`) are
this hook's state. A checkpoint due where validation also runs is written **after** that validation.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwright.checkpoint.manager import SaveRecord
from trainwright.checkpoint.settings import CheckpointSettings, check_template
from trainwright.checkpoint.storage import Location
from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.logging.metric_key import metric_key
from trainwright.registry import HOOKS, did_you_mean

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView, TrainLoopView


def _train_loop(trainer: TrainerView) -> TrainLoopView:
    return require_train_loop(trainer, "CheckpointHook (it saves training checkpoints)")


#: mmengine's defaults for inferring a ``save_best`` rule from the metric's name (matched case-insensitively,
#: first as the whole key, then as a substring: ``"val/acc"`` contains ``"acc"``).
DEFAULT_GREATER_KEYS: tuple[str, ...] = (
    "acc",
    "top",
    "AR@",
    "auc",
    "precision",
    "mAP",
    "mDice",
    "mIoU",
    "mAcc",
    "aAcc",
)
DEFAULT_LESS_KEYS: tuple[str, ...] = ("loss",)
_RULES = ("greater", "less")


def _str_list(name: str, value: Any, example: str) -> list[str] | None:
    """``value`` as a list of distinct non-empty strings (a str is one), None for None; else a TypeError naming
    ``name``."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) and v for v in items):
        raise TypeError(
            f"CheckpointHook {name} must be a str, a non-empty list of str or None (e.g. {example}), got "
            f"{type(value).__name__} {value!r}"
        )
    dup = sorted({v for v in items if items.count(v) > 1})
    if dup:
        raise ValueError(f"CheckpointHook {name} lists {dup} more than once; give each once")
    return list(items)


def infer_rule(
    key: str, greater_keys: Sequence[str] = DEFAULT_GREATER_KEYS, less_keys: Sequence[str] = DEFAULT_LESS_KEYS
) -> str:
    """``"greater"`` or ``"less"`` for a metric key, by mmengine's rules (case-insensitive).

    The key equal to one of ``greater_keys`` / ``less_keys``, else containing one of
    ``greater_keys``, else containing one of ``less_keys`` (``"val/acc"`` → greater,
    ``"val/loss"`` → less).

    Raises:
        ValueError: no rule matches (the message says how to give one).
    """
    k = key.lower()
    greater, less = {g.lower() for g in greater_keys}, {x.lower() for x in less_keys}
    if k in greater:
        return "greater"
    if k in less:
        return "less"
    if any(g in k for g in greater):
        return "greater"
    if any(x in k for x in less):
        return "less"
    raise ValueError(
        f"CheckpointHook cannot tell whether a higher or a lower {key!r} is better: it matches none of greater_keys "
        f"{list(greater_keys)} nor less_keys {list(less_keys)}. Pass rule='greater' or rule='less' (a list of rules "
        "for several "
        "save_best keys), or add the name to greater_keys / less_keys"
    )


@HOOKS.register
class CheckpointHook(Hook):
    """Saves ``epoch_{n}.pth`` / ``iter_{n}.pth`` (and ``best_*.pth``) into ``work_dir/checkpoints``.

    A checkpoint due where validation also runs (an epoch end, an iteration that validates) is
    written after that validation: it holds its scores, and a resumed run neither validates
    twice nor skips one (validation leaves the training random streams as it found them).
    A writer that raises never costs a checkpoint: with ``Trainer(writers_fail="raise")`` its
    error waits while a save may be due (this hook tells the writers when) and is raised at the
    end of this hook's event, after the save.

    Args:
        interval: Save every ``interval`` epochs (``by_epoch``) or iterations; <= 0 disables
            periodic saving (the final checkpoint is still written when ``save_last``).
        by_epoch: Count ``interval`` in epochs or in iterations.
        max_keep_ckpts: Keep only the newest k periodic checkpoints (-1: keep all). Old ones
            are deleted only after the new one (and the ``latest`` pointer) is complete.
        keep: ``dict(last=k, weights_every=n)``: keep the newest k periodic checkpoints whole; of the older ones,
            those whose number is a multiple of n are thinned to weights (``weights/<name>``, ``meta`` + ``model``)
            and the rest deleted, each only after the new one is complete (``max_keep_ckpts=k`` is
            ``keep=dict(last=k)``).
        preflight: Before training, refuse the run when what it keeps (``keep`` / ``max_keep_ckpts``; all of its
            periodic checkpoints when it keeps all) would not fit in the folder's free space (local disk, or a store
            that tells); False skips the check.
        save_last: Also save when training ends (normally, early-stopped or preempted), unless
            that iteration was just saved.
        save_optimizer / save_param_scheduler: Include those states (needed to resume).
        save_best: A metric key (``"val/acc"``), ``"auto"`` (the first validation metric), or
            a list of keys: for each key, keep ``best_<key>_<epoch|iter>_<n>.pth`` of its best
            scores so far (``/`` in a key becomes ``_``). The keys are checked against the
            first validation's metrics (an unknown key is a ``KeyError`` naming the metrics).
        rule: ``"greater"`` or ``"less"``, or a list of them, one per ``save_best`` key (a
            single rule applies to every key); None infers each key's rule from
            ``greater_keys`` / ``less_keys`` (see :func:`infer_rule`).
        greater_keys / less_keys: Names that infer ``"greater"`` / ``"less"`` (mmengine's
            :data:`DEFAULT_GREATER_KEYS` / :data:`DEFAULT_LESS_KEYS` when None).
        max_keep_best: How many best checkpoints to keep per key (the k best scores).
        out_dir: Directory for the files (default ``work_dir/checkpoints``): a local folder or an
            fsspec URL (``s3://bucket/run``, ``gs://...``, ``memory://...``; see "Checkpoints on object
            storage" in docs/checkpoints.md). The trainer checks a URL when it is built (a probe
            object is written and deleted): a missing bucket, refused credentials or an
            unreachable endpoint fail there, naming the URL. ``resume=True`` looks here.
        storage_options: fsspec options of a URL ``out_dir`` (mmengine's name), e.g. s3fs's
            ``dict(client_kwargs=dict(endpoint_url="http://minio:9000"))``; credentials otherwise
            come from the environment (``AWS_ACCESS_KEY_ID``...). Rather not put secrets here:
            the trainer's settings are written into the run folder and every checkpoint.
        async_save: Write in a background thread; the loop only waits for the copy of the
            state to CPU memory (see :mod:`trainwright.checkpoint.async_writer`).
        clean_stale_tmp: At the start of training, rank 0 deletes temporary files that
            writers killed mid-write left in the directory (those of processes that no
            longer exist).
        save_begin: The epoch (``by_epoch``) or iteration from which periodic saving starts:
            saves happen at ``save_begin``, ``save_begin + interval``, ... (0: at multiples of
            ``interval``), as in mmengine.
        filename_tmpl: Name of periodic checkpoints, with one ``{}`` for the epoch
            (``by_epoch``) or iteration count; default ``"epoch_{}.pth"`` / ``"iter_{}.pth"``.
            A save in the middle of an epoch of an epoch-interval hook (preemption) keeps
            ``iter_{n}.pth``.
        published_keys: After training, publish the last checkpoint (when ``save_last``) and
            the best one of each ``save_best`` key stripped to these top-level keys (e.g.
            ``["meta", "model"]``), as ``<name>-<first 8 hex digits of its sha256>.pth``
            beside the original (mmengine's ``publish_checkpoint`` naming).
    """

    priority = "VERY_LOW"

    def __init__(
        self,
        interval: int = 1,
        by_epoch: bool = True,
        max_keep_ckpts: int = -1,
        save_last: bool = True,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        save_best: str | list[str] | None = None,
        rule: str | list[str | None] | None = None,
        max_keep_best: int = 1,
        out_dir: str | Path | None = None,
        storage_options: dict[str, Any] | None = None,
        async_save: bool = False,
        clean_stale_tmp: bool = True,
        save_begin: int = 0,
        filename_tmpl: str | None = None,
        greater_keys: str | Sequence[str] | None = None,
        less_keys: str | Sequence[str] | None = None,
        published_keys: str | Sequence[str] | None = None,
        keep: dict[str, int] | None = None,
        preflight: bool = True,
    ) -> None:
        if max_keep_best < 1:
            raise ValueError(f"CheckpointHook max_keep_best must be >= 1, got {max_keep_best}")
        if not isinstance(save_begin, int) or save_begin < 0:
            raise ValueError(
                "CheckpointHook save_begin must be an int >= 0 (the first epoch / iteration to save at), got "
                f"{save_begin!r}"
            )
        keys = _str_list("save_best", save_best, "'val/acc', 'auto' or ['val/acc', 'val/loss']")
        if keys is not None and "auto" in keys and len(keys) > 1:
            raise ValueError(
                f"CheckpointHook save_best={keys}: 'auto' (the first metric) cannot be combined with other keys; name "
                "the keys instead"
            )
        rules = self._rules(rule, keys)
        greater = _str_list(
            "greater_keys", list(greater_keys) if isinstance(greater_keys, tuple) else greater_keys, "['acc', 'mAP']"
        )
        less = _str_list(
            "less_keys", list(less_keys) if isinstance(less_keys, tuple) else less_keys, "['loss', 'error']"
        )
        self.greater_keys = tuple(greater) if greater is not None else DEFAULT_GREATER_KEYS
        self.less_keys = tuple(less) if less is not None else DEFAULT_LESS_KEYS
        self.interval = interval
        self.by_epoch = by_epoch
        self.max_keep_ckpts = max_keep_ckpts
        self.save_last = save_last
        self.save_optimizer = save_optimizer
        self.save_param_scheduler = save_param_scheduler
        self.save_best = keys
        #: The rule of each ``save_best`` key (None: inferred; for ``"auto"`` at the first validation).
        self.rule = {
            k: r or (None if k == "auto" else infer_rule(k, self.greater_keys, self.less_keys))
            for k, r in zip(keys or [], rules)
        }
        self.max_keep_best = max_keep_best
        self.filename_tmpl = check_template(filename_tmpl) if filename_tmpl is not None else None
        given: dict[str, Any] = {
            k: v
            for k, v, default in (
                ("out_dir", out_dir, None),
                ("storage_options", storage_options, None),
                ("max_keep_ckpts", max_keep_ckpts, -1),
                ("keep", keep, None),
                ("async_save", async_save, False),
                ("epoch_tmpl" if by_epoch else "iter_tmpl", filename_tmpl, None),
                ("save_optimizer", save_optimizer, True),
                ("save_param_scheduler", save_param_scheduler, True),
            )
            if v != default
        }
        # checked (and a URL resolved: a missing fsspec backend fails) now; the Trainer gives them to its checkpoint
        # manager
        settings = CheckpointSettings.build(given)
        given.pop("storage_options", None)
        if given.pop("keep", None) is not None:  # the manager's settings hold it as these two
            given["max_keep_ckpts"], given["weights_every"] = settings.max_keep_ckpts, settings.weights_every
            self.max_keep_ckpts = settings.max_keep_ckpts
        #: Refuse a run whose kept checkpoints would not fit in the folder's free space, before training.
        self.preflight = preflight
        if settings.out_dir is not None:
            given["out_dir"] = settings.out_dir
        self.checkpoint_settings = given
        #: Where the checkpoints go (None: ``work_dir/checkpoints``); the manager's ``ckpt_dir`` once the Trainer is
        #: built.
        self.out_dir: Location | None = settings.out_dir
        self.async_save = async_save
        self.clean_stale_tmp = clean_stale_tmp
        self.save_begin = save_begin
        self.published_keys = _str_list(
            "published_keys",
            list(published_keys) if isinstance(published_keys, tuple) else published_keys,
            "['meta', 'model']",
        )
        #: The files kept (periodic, best per key) and the last saved iteration: this hook's state, kept by the manager.
        self.record = SaveRecord()
        self._keys: dict[str, str] | None = None  # metric key -> rule, resolved at the first validation
        self._pending: str | None = None
        self._pending_best: list[tuple[str, float, str]] = []
        self._in_train = False
        self._saves_in_run = 0  # periodic saves in this train(): the second one checks the free space again
        self._progress: Any = None  # trainer.progress and .train_loop during train(): what save_may_follow() reads
        self._loop: TrainLoopView | None = None

    @staticmethod
    def _rules(rule: Any, keys: list[str] | None) -> list[str | None]:
        rules = rule if isinstance(rule, list) else [rule]
        bad = [r for r in rules if r not in (None, *_RULES)]
        if bad or not rules:
            raise ValueError(
                "CheckpointHook rule must be 'greater', 'less', None or a list of them (one per save_best key), got "
                f"{rule!r}"
            )
        n = len(keys or [])
        if len(rules) == 1:
            return rules * n
        if len(rules) != n:
            raise ValueError(
                f"CheckpointHook got {len(rules)} rules {rules} for {n} save_best keys {keys}; give one rule per key, "
                "or one rule for all"
            )
        return list(rules)

    @property
    def kept(self) -> list[str]:
        """The periodic checkpoints kept, oldest first."""
        return self.record.kept

    @property
    def best(self) -> dict[str, list[tuple[float, str]]]:
        """Per monitored key, its kept best checkpoints ``(score, file name)``, best first."""
        return self.record.best

    @property
    def best_score(self) -> float | None:
        """The best score so far of the first ``save_best`` key (None before the first validation)."""
        return self.record.state_dict()["best_score"]  # type: ignore[no-any-return]

    @property
    def best_ckpt(self) -> str | None:
        """File name of the best checkpoint so far of the first ``save_best`` key."""
        return self.record.state_dict()["best_ckpt"]  # type: ignore[no-any-return]

    def checkpoint_record(self) -> SaveRecord:
        """:attr:`record`: the checkpoint manager records every save in it (a save before ``train()`` too)."""
        return self.record

    def saves_periodic_checkpoints(self) -> bool:
        """True when ``interval > 0`` (a spike-guard rollback needs periodic checkpoints)."""
        return self.interval > 0

    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        return self.record.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: D102
        self.record.load_state_dict(state)

    # -- events ---------------------------------------------------------------------------
    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        if self.save_best and trainer.val_loop is None:
            trainer.logger.warning(
                f"CheckpointHook save_best={self.save_best} needs validation metrics, but the trainer has no "
                "val_dataloader: no best "
                "checkpoint will be written. Pass val_dataloader and val_evaluator, or set "
                "default_hooks=dict(checkpoint=dict(save_best=None))"
            )
        m = trainer.checkpoints
        if self.published_keys:
            if not trainer.strategy.readable_whole:
                raise ValueError(
                    f"CheckpointHook published_keys={self.published_keys} cannot publish under "
                    f"strategy={trainer.strategy.name!r}: its checkpoints "
                    f"({trainer.strategy.checkpoint_suffix} folders) are read by its engine on every rank, not whole "
                    "by one process. Drop "
                    "published_keys and export the weights after training with "
                    "trainer.save_weights('model.safetensors') (every rank calls it)."
                )
            m.check_keys(self.published_keys)
        self._in_train = True
        self._progress, self._loop = trainer.progress, trainer.train_loop  # what save_may_follow() reads
        loop = _train_loop(trainer)
        late = {k: v for k, v in self.checkpoint_settings.items() if getattr(m.settings, k) != v}
        if late:  # a hook registered after the trainer was built: its storage settings never reached the manager
            raise ValueError(
                f"CheckpointHook {late} were given to a hook registered after the Trainer was built, whose checkpoint "
                "manager was built "
                "with others. Give them when building it: "
                f"Trainer(checkpoint=dict({', '.join(f'{k}=...' for k in late)}))"
            )
        if self.by_epoch and self.interval > 0 and not loop.by_epoch:
            trainer.logger.warning(
                "CheckpointHook counts its interval in epochs (by_epoch=True) but training is iteration-based: only "
                "the final "
                "checkpoint will be written. Set default_hooks=dict(checkpoint=dict(by_epoch=False, interval=N)) to "
                "save every N iterations."
            )
        if self.clean_stale_tmp and trainer.strategy.is_main_process:
            m.clean_stale_tmp()
        self._saves_in_run = 0
        if self.preflight:
            m.preflight(self._planned_saves(trainer, loop))

    def _planned_saves(self, trainer: TrainerView, loop: TrainLoopView) -> list[int] | None:
        """The numbers of the periodic saves still to come (None: unknown, e.g. epochs of a stream)."""
        if self.interval <= 0:
            return []
        end = loop.max_iters
        if self.by_epoch:
            try:
                end = math.ceil(end / len(loop.dataloader))
            except TypeError:  # a stream without __len__
                return None
        done = trainer.progress.epoch if self.by_epoch else trainer.progress.iteration
        return [n for n in range(done + 1, end + 1) if self._due(n)]

    def train_iter_interval(self, trainer: TrainerView) -> int | range:  # noqa: D102
        # Epoch-interval saves are requested (and a pending one flushed) at epoch events only; iteration saves at
        # save_begin + k * interval.
        return (
            0
            if self.by_epoch or self.interval <= 0
            else range(self.save_begin or self.interval, sys.maxsize, self.interval)
        )

    def save_may_follow(self) -> bool:
        """Whether this hook may still save at the current point of training (the writers' ``SaveAhead`` question: a
        writer's error then waits for :meth:`_writers_error`).

        Between epochs and at the run's end (epoch events, validation, ``after_train``), while a save waits
        for its validation, and at an iteration with an iteration-interval save due; never outside ``train()``.
        """
        p, loop = self._progress, self._loop
        if not self._in_train or p is None:
            return False
        return (
            self._pending is not None
            or p.iter_in_epoch == 0
            or (loop is not None and p.iteration >= loop.max_iters)
            or (not self.by_epoch and self._due(p.iteration))
        )

    def _writers_error(self, trainer: TrainerView, final: bool = False) -> None:
        """After this event's save: raise a writer's error held for it (``writers_fail="raise"``).

        Not while a save waits for its validation, nor before ``after_train`` (``final``) once the
        run's last iteration is done: the last checkpoint (``save_last``) is written there.
        """
        loop = trainer.train_loop
        last = loop is not None and trainer.progress.iteration >= loop.max_iters
        if self._pending is None and (final or not last):
            trainer.log_lines.writers.raise_held()

    def _due(self, n: int) -> bool:
        """Whether a periodic save falls on epoch / iteration ``n`` (mmengine's ``every_n_*`` with
        ``start=save_begin``)."""
        return self.interval > 0 and n >= self.save_begin and (n - self.save_begin) % self.interval == 0

    def after_train_iter(
        self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:  # noqa: D102
        if self._pending is not None:  # a validation we waited for did not come: save what we have
            self._flush_pending(trainer)
        it = trainer.progress.iteration
        if not self.by_epoch and self._due(it):
            loop = _train_loop(trainer)
            self._request(
                trainer,
                trainer.checkpoints.name(trainer.checkpoints.iter_tmpl, it),
                not loop.by_epoch and loop.val_due(),
            )
        self._writers_error(trainer)

    def after_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        loop = _train_loop(trainer)
        epoch = trainer.progress.epoch
        if self.by_epoch and loop.by_epoch and self._due(epoch):
            self._request(trainer, trainer.checkpoints.name(trainer.checkpoints.epoch_tmpl, epoch), loop.val_due())
        self._writers_error(trainer)

    def before_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self._flush_pending(trainer)
        self._writers_error(trainer)

    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        if not self.save_best or not metrics or not self._in_train:
            return
        rules = self._resolve_keys(metrics)  # every key checked before any is used
        p = trainer.progress
        m = trainer.checkpoints
        stem = m.name(m.epoch_tmpl, p.epoch) if _train_loop(trainer).by_epoch else m.name(m.iter_tmpl, p.iteration)
        for key in rules:
            score = float(metrics[key])
            if not math.isnan(score):
                self._pending_best.append((key, score, f"best_{key.replace('/', '_')}_{stem}"))

    def _resolve_keys(self, metrics: dict[str, float]) -> dict[str, str]:
        """``{metric key: rule}`` of the ``save_best`` keys ("auto": the first metric, its rule inferred now).

        Raises:
            KeyError: a key is not among ``metrics`` (names it, the metrics and the fix).
        """
        if self._keys is None:
            assert self.save_best is not None
            first = next(iter(metrics))
            self._keys = {  # an mmengine key ('mIoU') is found as 'val/mIoU'; one absent is named below
                first if k == "auto" else metric_key(k, metrics) or k: self.rule[k]
                or infer_rule(first, self.greater_keys, self.less_keys)
                for k in self.save_best
            }
        for key in self._keys:
            if key not in metrics:
                raise KeyError(
                    f"CheckpointHook save_best: {key!r} is not among the validation metrics "
                    f"{list(metrics)}.{did_you_mean(key, list(metrics))} "
                    "Set save_best to one of them (or 'auto' for the first), e.g. "
                    f"default_hooks=dict(checkpoint=dict(save_best={next(iter(metrics))!r}))"
                )
        return self._keys

    def after_val(self, trainer: TrainerView) -> None:  # noqa: D102
        if not self._in_train:
            return
        pending, self._pending_best = self._pending_best, []
        for key, score, name in pending:
            if trainer.checkpoints.save_best(
                key, score, name, greater=(self._keys or {}).get(key) == "greater", keep=self.max_keep_best
            ):
                trainer.logger.info(f"New best {key} {score:.4f}: saved {name}")
        self._flush_pending(trainer)
        self._writers_error(trainer)

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._flush_pending(trainer)
        if self.save_last:
            trainer.checkpoints.save_now()
        trainer.strategy.wait_for_checkpoint()
        if self.published_keys and trainer.strategy.is_main_process:
            names = ([self.kept[-1]] if self.save_last and self.kept else []) + [
                ranked[0][1] for ranked in self.best.values() if ranked
            ]
            for name in dict.fromkeys(names):
                trainer.checkpoints.publish(trainer.checkpoints.ckpt_dir / name, self.published_keys)
        self._writers_error(trainer, final=True)

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        refused = trainer.checkpoints.refusal(self._pending) if self._in_train and self._pending is not None else None
        if refused is not None:  # several processes: no collective after a failure
            trainer.logger.warning(
                f"{refused} (it was due before the run stopped, waiting for a validation that did not finish)"
            )
        elif self._in_train and self._pending is not None:
            # The run ended by an error after a checkpoint was due but before the validation
            # it waited for finished (a metric that raised): the epoch's training is not lost.
            trainer.logger.warning(
                f"Writing {self._pending}, which was due before the run stopped (it waited for a validation that did "
                "not finish)"
            )
            self._saves_in_run = -1  # no free-space check on the way out of a failed run
            self._flush_pending(trainer)
        self._in_train = False
        self._progress = self._loop = None
        self._pending = None
        self._pending_best = []
        trainer.strategy.wait_for_checkpoint()

    def _request(self, trainer: TrainerView, name: str, after_val: bool) -> None:
        self._pending = name
        if not after_val:
            self._flush_pending(trainer)

    def _flush_pending(self, trainer: TrainerView) -> None:
        name, self._pending = self._pending, None
        if name is not None:
            trainer.checkpoints.save_periodic(name)
            self._saves_in_run += 1
            if self.preflight and self._saves_in_run == 2 and self._loop is not None:
                # the first file is complete now (one write in flight): check again with its real size, which holds
                # an optimizer state made at its first step (Adam's moments) that the estimate before training missed
                trainer.checkpoints.preflight(
                    self._planned_saves(trainer, _train_loop(trainer)), at=trainer.progress.iteration
                )
