"""CheckpointHook: periodic, last and best checkpoints, written atomically, kept k at a time.

What a run can rely on:

* Every file is written through ``trainer.save_checkpoint`` (the strategy's
  ``save_checkpoint``: atomic, rank 0, in the background with ``async_save``).
* Every file is complete or absent (:func:`~trainwright.checkpoint.atomic_save`), the
  ``latest`` pointer is updated only after its file is complete, and checkpoints that fall
  out of the keep window are deleted only after that, so a ``kill -9`` at any moment
  leaves at least one complete checkpoint that ``latest`` (or the directory listing) finds.
* A checkpoint due at a point where validation also runs (the end of an epoch, or an
  iteration that validates) is written **after** that validation, so it holds the best
  score and the metrics of that validation and a resumed run does not validate twice or
  skip one.
* Validation during training does not move the training random streams (the train loop
  puts the RNG states back after each validation pass), so a run resumed from a checkpoint
  written before a validation it then skips draws the same random numbers as a run that did it.
* While it trains, the hook serves :meth:`Trainer.request_checkpoint
  <trainwright.Trainer.request_checkpoint>` (e.g. on preemption) with :meth:`CheckpointHook.save_now`.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainwright.checkpoint.io import CHECKPOINT_SUFFIX
from trainwright.hooks.hook import Hook
from trainwright.hooks.view import require_train_loop
from trainwright.registry import HOOKS, did_you_mean

if TYPE_CHECKING:
    from trainwright.hooks.view import TrainerView, TrainLoopView

_TMP_NAME = re.compile(r"^\..+\.tmp\.(?P<pid>\d+)\.[0-9a-f]+$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _train_loop(trainer: TrainerView) -> TrainLoopView:
    return require_train_loop(trainer, "CheckpointHook (it saves training checkpoints)")


#: mmengine's defaults for inferring a ``save_best`` rule from the metric's name (matched case-insensitively,
#: first as the whole key, then as a substring: ``"val/acc"`` contains ``"acc"``).
DEFAULT_GREATER_KEYS: tuple[str, ...] = ("acc", "top", "AR@", "auc", "precision", "mAP", "mDice", "mIoU", "mAcc", "aAcc")
DEFAULT_LESS_KEYS: tuple[str, ...] = ("loss",)
_RULES = ("greater", "less")


def _str_list(name: str, value: Any, example: str) -> list[str] | None:
    """``value`` as a list of distinct non-empty strings (a str is one), None for None; else a TypeError naming ``name``."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) and v for v in items):
        raise TypeError(f"CheckpointHook {name} must be a str, a non-empty list of str or None (e.g. {example}), got {type(value).__name__} {value!r}")
    dup = sorted({v for v in items if items.count(v) > 1})
    if dup:
        raise ValueError(f"CheckpointHook {name} lists {dup} more than once; give each once")
    return list(items)


def infer_rule(key: str, greater_keys: Sequence[str] = DEFAULT_GREATER_KEYS, less_keys: Sequence[str] = DEFAULT_LESS_KEYS) -> str:
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
        f"{list(greater_keys)} nor less_keys {list(less_keys)}. Pass rule='greater' or rule='less' (a list of rules for several "
        "save_best keys), or add the name to greater_keys / less_keys"
    )


@HOOKS.register
class CheckpointHook(Hook):
    """Saves ``epoch_{n}.pth`` / ``iter_{n}.pth`` (and ``best_*.pth``) into ``work_dir/checkpoints``.

    Args:
        interval: Save every ``interval`` epochs (``by_epoch``) or iterations; <= 0 disables
            periodic saving (the final checkpoint is still written when ``save_last``).
        by_epoch: Count ``interval`` in epochs or in iterations.
        max_keep_ckpts: Keep only the newest k periodic checkpoints (-1: keep all). Old ones
            are deleted only after the new one (and the ``latest`` pointer) is complete.
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
        out_dir: Directory for the files (default ``work_dir/checkpoints``).
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
        async_save: bool = False,
        clean_stale_tmp: bool = True,
        save_begin: int = 0,
        filename_tmpl: str | None = None,
        greater_keys: str | Sequence[str] | None = None,
        less_keys: str | Sequence[str] | None = None,
        published_keys: str | Sequence[str] | None = None,
    ) -> None:
        if max_keep_best < 1:
            raise ValueError(f"CheckpointHook max_keep_best must be >= 1, got {max_keep_best}")
        if max_keep_ckpts == 0:
            raise ValueError("CheckpointHook max_keep_ckpts=0 would delete every checkpoint; use -1 to keep all or k >= 1")
        if not isinstance(save_begin, int) or save_begin < 0:
            raise ValueError(f"CheckpointHook save_begin must be an int >= 0 (the first epoch / iteration to save at), got {save_begin!r}")
        keys = _str_list("save_best", save_best, "'val/acc', 'auto' or ['val/acc', 'val/loss']")
        if keys is not None and "auto" in keys and len(keys) > 1:
            raise ValueError(f"CheckpointHook save_best={keys}: 'auto' (the first metric) cannot be combined with other keys; name the keys instead")
        rules = self._rules(rule, keys)
        greater = _str_list("greater_keys", list(greater_keys) if isinstance(greater_keys, tuple) else greater_keys, "['acc', 'mAP']")
        less = _str_list("less_keys", list(less_keys) if isinstance(less_keys, tuple) else less_keys, "['loss', 'error']")
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
        self.rule = {k: r or (None if k == "auto" else infer_rule(k, self.greater_keys, self.less_keys)) for k, r in zip(keys or [], rules)}
        self.max_keep_best = max_keep_best
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.async_save = async_save
        self.clean_stale_tmp = clean_stale_tmp
        self.save_begin = save_begin
        self.filename_tmpl = self._check_template(filename_tmpl)
        self._epoch_tmpl = filename_tmpl if filename_tmpl is not None and by_epoch else "epoch_{}.pth"
        self._iter_tmpl = filename_tmpl if filename_tmpl is not None and not by_epoch else "iter_{}.pth"
        self.published_keys = _str_list("published_keys", list(published_keys) if isinstance(published_keys, tuple) else published_keys, "['meta', 'model']")
        self.kept: list[str] = []
        #: Per monitored key, its kept best checkpoints ``(score, file name)``, best first.
        self.best: dict[str, list[tuple[float, str]]] = {}
        self._keys: dict[str, str] | None = None  # metric key -> rule, resolved at the first validation
        self._last_saved_iter = -1
        self._pending: str | None = None
        self._pending_best: list[tuple[str, float, str]] = []
        self._in_train = False

    @staticmethod
    def _rules(rule: Any, keys: list[str] | None) -> list[str | None]:
        rules = rule if isinstance(rule, list) else [rule]
        bad = [r for r in rules if r not in (None, *_RULES)]
        if bad or not rules:
            raise ValueError(f"CheckpointHook rule must be 'greater', 'less', None or a list of them (one per save_best key), got {rule!r}")
        n = len(keys or [])
        if len(rules) == 1:
            return rules * n
        if len(rules) != n:
            raise ValueError(f"CheckpointHook got {len(rules)} rules {rules} for {n} save_best keys {keys}; give one rule per key, or one rule for all")
        return list(rules)

    @staticmethod
    def _check_template(tmpl: str | None) -> str | None:
        if tmpl is None:
            return None
        if not isinstance(tmpl, str) or tmpl.count("{}") != 1 or "/" in tmpl or not tmpl.endswith(".pth") or tmpl.startswith((".", "best_")):
            raise ValueError(
                f"CheckpointHook filename_tmpl must be a file name with exactly one '{{}}' for the epoch / iteration that ends in '.pth' "
                f"and starts neither with '.' nor 'best_' (resume looks for such files), e.g. 'epoch_{{}}.pth'; got {tmpl!r}"
            )
        return tmpl

    @property
    def best_score(self) -> float | None:
        """The best score so far of the first ``save_best`` key (None before the first validation)."""
        best = next(iter(self.best.values()), None)
        return best[0][0] if best else None

    @property
    def best_ckpt(self) -> str | None:
        """File name of the best checkpoint so far of the first ``save_best`` key."""
        best = next(iter(self.best.values()), None)
        return best[0][1] if best else None

    # -- state (kept files, best scores survive resume) -------------------------------------
    def state_dict(self) -> dict[str, Any]:  # noqa: D102
        # "best": [score, file, key] triples, best first per key (a list of [score, file] pairs before several keys)
        best = [[s, n, k] for k, ranked in self.best.items() for s, n in ranked]
        return {"kept": list(self.kept), "best": best, "best_score": self.best_score, "best_ckpt": self.best_ckpt, "last_saved_iter": self._last_saved_iter}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: D102
        self.kept = list(state.get("kept", []))
        entries = state.get("best")
        if entries is None and state.get("best_score") is not None:
            entries = [[state["best_score"], state.get("best_ckpt")]]
        first = (self.save_best or ["auto"])[0]
        self.best = {}
        for entry in entries or []:
            key = str(entry[2]) if len(entry) > 2 else first  # a checkpoint of one key: it is the first key's
            self.best.setdefault(key, []).append((float(entry[0]), str(entry[1])))
        self._last_saved_iter = int(state.get("last_saved_iter", -1))

    # -- events ---------------------------------------------------------------------------
    def before_train(self, trainer: TrainerView) -> None:  # noqa: D102
        if self.save_best and trainer.val_loop is None:
            trainer.logger.warning(
                f"CheckpointHook save_best={self.save_best} needs validation metrics, but the trainer has no val_dataloader: no best "
                "checkpoint will be written. Pass val_dataloader and val_evaluator, or set default_hooks=dict(checkpoint=dict(save_best=None))"
            )
        if self.published_keys:
            pieces = ["meta", *trainer.stateful]
            for key in self.published_keys:
                if key not in pieces:
                    hint = " (mmengine's 'state_dict' is trainwright's 'model')" if key == "state_dict" else ""
                    raise ValueError(
                        f"CheckpointHook published_keys: {key!r} is not a key of this trainer's checkpoints {pieces}{hint}.{did_you_mean(key, pieces)} "
                        "Publish some of those, e.g. published_keys=['meta', 'model']"
                    )
        self._in_train = True
        trainer.set_checkpoint_server(self.save_now)
        if self.by_epoch and self.interval > 0 and not _train_loop(trainer).by_epoch:
            trainer.logger.warning(
                "CheckpointHook counts its interval in epochs (by_epoch=True) but training is iteration-based: only the final "
                "checkpoint will be written. Set default_hooks=dict(checkpoint=dict(by_epoch=False, interval=N)) to save every N iterations."
            )
        if self.clean_stale_tmp and trainer.is_main_process:
            self._clean_stale_tmp(trainer)

    def train_iter_interval(self, trainer: TrainerView) -> int:  # noqa: D102
        # Epoch-interval saves are requested (and a pending one flushed) at epoch events only. Iteration saves fall on
        # save_begin + k * interval: all multiples of gcd(interval, save_begin) (of interval itself when save_begin is 0).
        return 0 if self.by_epoch or self.interval <= 0 else math.gcd(self.interval, self.save_begin)

    @staticmethod
    def _name(trainer: TrainerView, tmpl: str, n: int) -> str:
        """The file name ``tmpl`` gives ``n``, with the strategy's suffix (``.pth``; a DCP directory's ``.dcp``...)."""
        name = tmpl.format(n)
        suffix = trainer.strategy.checkpoint_suffix
        return name if suffix == CHECKPOINT_SUFFIX else name[: -len(CHECKPOINT_SUFFIX)] + suffix

    def _due(self, n: int) -> bool:
        """Whether a periodic save falls on epoch / iteration ``n`` (mmengine's ``every_n_*`` with ``start=save_begin``)."""
        return self.interval > 0 and n >= self.save_begin and (n - self.save_begin) % self.interval == 0

    def after_train_iter(self, trainer: TrainerView, batch_idx: int, data_batch: Any = None, outputs: dict | None = None) -> None:  # noqa: D102
        if self._pending is not None:  # a validation we waited for did not come: save what we have
            self._flush_pending(trainer)
        it = trainer.progress.iteration
        if not self.by_epoch and self._due(it):
            loop = _train_loop(trainer)
            self._request(trainer, self._name(trainer, self._iter_tmpl, it), not loop.by_epoch and loop.val_due())

    def after_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        loop = _train_loop(trainer)
        epoch = trainer.progress.epoch
        if self.by_epoch and loop.by_epoch and self._due(epoch):
            self._request(trainer, self._name(trainer, self._epoch_tmpl, epoch), loop.val_due())

    def before_train_epoch(self, trainer: TrainerView) -> None:  # noqa: D102
        self._flush_pending(trainer)

    def after_val_epoch(self, trainer: TrainerView, metrics: dict[str, float] | None = None) -> None:  # noqa: D102
        if not self.save_best or not metrics or not self._in_train:
            return
        rules = self._resolve_keys(metrics)  # every key checked before any is used
        p = trainer.progress
        stem = self._name(trainer, self._epoch_tmpl, p.epoch) if _train_loop(trainer).by_epoch else self._name(trainer, self._iter_tmpl, p.iteration)
        for key, rule in rules.items():
            score = float(metrics[key])
            if math.isnan(score):
                continue
            ranked = self.best.get(key, [])
            if len(ranked) >= self.max_keep_best and not (score > ranked[-1][0] if rule == "greater" else score < ranked[-1][0]):
                continue
            self._pending_best.append((key, score, f"best_{key.replace('/', '_')}_{stem}"))

    def _resolve_keys(self, metrics: dict[str, float]) -> dict[str, str]:
        """``{metric key: rule}`` of the ``save_best`` keys ("auto": the first metric, its rule inferred now).

        Raises:
            KeyError: a key is not among ``metrics`` (names it, the metrics and the fix).
        """
        if self._keys is None:
            assert self.save_best is not None
            first = next(iter(metrics))
            self._keys = {
                first if k == "auto" else k: self.rule[k] or infer_rule(first, self.greater_keys, self.less_keys) for k in self.save_best
            }
            if "auto" in self.best:  # loaded from a checkpoint of one key, saved before it was resolved
                self.best.setdefault(first, self.best.pop("auto"))
        for key in self._keys:
            if key not in metrics:
                raise KeyError(
                    f"CheckpointHook save_best: {key!r} is not among the validation metrics {list(metrics)}.{did_you_mean(key, list(metrics))} "
                    f"Set save_best to one of them (or 'auto' for the first), e.g. default_hooks=dict(checkpoint=dict(save_best={next(iter(metrics))!r}))"
                )
        return self._keys

    def after_val(self, trainer: TrainerView) -> None:  # noqa: D102
        if not self._in_train:
            return
        pending, self._pending_best = self._pending_best, []
        for key, score, name in pending:
            greater = (self._keys or {}).get(key) == "greater"
            ranked = sorted([*[b for b in self.best.get(key, []) if b[1] != name], (score, name)], key=lambda b: -b[0] if greater else b[0])
            self.best[key], dropped = ranked[: self.max_keep_best], [n for _, n in ranked[self.max_keep_best :]]
            self._write(trainer, name, latest=False, remove=dropped)
            trainer.logger.info(f"New best {key} {score:.4f}: saved {name}")
        self._flush_pending(trainer)

    def after_train(self, trainer: TrainerView) -> None:  # noqa: D102
        self._flush_pending(trainer)
        if self.save_last:
            self.save_now(trainer)
        trainer.strategy.wait_for_checkpoint()
        if self.published_keys and trainer.is_main_process:
            names = ([self.kept[-1]] if self.save_last and self.kept else []) + [ranked[0][1] for ranked in self.best.values() if ranked]
            for name in dict.fromkeys(names):
                self.publish(trainer, self.ckpt_dir(trainer) / name)

    def after_run(self, trainer: TrainerView) -> None:  # noqa: D102
        if self._in_train:
            trainer.set_checkpoint_server(None)
            if self._pending is not None:
                # The run ended by an error after a checkpoint was due but before the validation
                # it waited for finished (a metric that raised): the epoch's training is not lost.
                trainer.logger.warning(f"Writing {self._pending}, which was due before the run stopped (it waited for a validation that did not finish)")
                self._flush_pending(trainer)
        self._in_train = False
        self._pending = None
        self._pending_best = []
        trainer.strategy.wait_for_checkpoint()

    # -- public ---------------------------------------------------------------------------
    def save_now(self, trainer: TrainerView) -> Path | None:
        """Save the current state as a periodic checkpoint unless this iteration is saved already.

        Used at the end of training and, as the trainer's checkpoint server, by
        ``trainer.request_checkpoint()`` (preemption); returns the path written (or None).
        """
        self._flush_pending(trainer)
        p = trainer.progress
        if p.iteration == self._last_saved_iter:
            return None
        name = self._name(trainer, self._epoch_tmpl, p.epoch) if _train_loop(trainer).by_epoch and p.iter_in_epoch == 0 else self._name(trainer, self._iter_tmpl, p.iteration)
        self._save_periodic(trainer, name)
        return self.ckpt_dir(trainer) / name

    def publish(self, trainer: TrainerView, path: Path) -> Path:
        """Write ``path`` stripped to :attr:`published_keys` as ``<stem>-<sha256[:8]>.pth`` beside it (rank 0).

        The hash is of the published file's bytes, so ``sha256sum`` (and ``torch.hub``'s
        ``check_hash``) verify the name. Keys of the checkpoint that are not published are
        logged by name.
        """
        import hashlib
        import io

        import torch

        from trainwright.checkpoint.io import atomic_write_bytes, load_file

        assert self.published_keys is not None
        ckpt = load_file(path)
        removed = [k for k in ckpt if k not in self.published_keys]
        buf = io.BytesIO()
        torch.save({k: ckpt[k] for k in self.published_keys if k in ckpt}, buf)
        data = buf.getvalue()
        out = path.with_name(f"{path.stem}-{hashlib.sha256(data).hexdigest()[:8]}.pth")
        atomic_write_bytes(out, data)
        trainer.logger.info(f"Published {path.name} as {out} with keys {self.published_keys}" + (f" (left out {removed})" if removed else ""))
        return out

    def ckpt_dir(self, trainer: TrainerView) -> Path:
        """Where this hook writes."""
        return self.out_dir if self.out_dir is not None else trainer.ckpt_dir

    def _request(self, trainer: TrainerView, name: str, after_val: bool) -> None:
        self._pending = name
        if not after_val:
            self._flush_pending(trainer)

    def _flush_pending(self, trainer: TrainerView) -> None:
        name, self._pending = self._pending, None
        if name is not None:
            self._save_periodic(trainer, name)

    # -- writing --------------------------------------------------------------------------
    def _save_periodic(self, trainer: TrainerView, name: str) -> None:
        kept = [k for k in self.kept if k != name] + [name]
        dropped: list[str] = []
        if self.max_keep_ckpts > 0 and len(kept) > self.max_keep_ckpts:
            dropped, kept = kept[: -self.max_keep_ckpts], kept[-self.max_keep_ckpts :]
        self.kept = kept
        self._last_saved_iter = trainer.progress.iteration
        # Log records up to this point must survive a kill: the resumed run will not log them again.
        trainer.flush_logs()
        self._write(trainer, name, latest=True, remove=dropped)

    def _write(self, trainer: TrainerView, name: str, latest: bool, remove: list[str]) -> None:
        from trainwright.checkpoint.io import write_latest

        d = self.ckpt_dir(trainer)
        # files still wanted (a name can be both dropped from one list and kept in the other)
        wanted = set(self.kept) | {n for ranked in self.best.values() for _, n in ranked} | {name}
        remove = [r for r in remove if r not in wanted]

        def finish() -> None:  # rank 0, once the file is complete
            if latest:
                write_latest(d, name)
            for old in remove:
                trainer.strategy.remove_checkpoint(d / old)

        path = trainer.save_checkpoint(d / name, self.save_optimizer, self.save_param_scheduler, async_save=self.async_save, after=finish)
        trainer.logger.info(f"Saving checkpoint {path} in the background" if self.async_save else f"Saved checkpoint {path}")

    def _clean_stale_tmp(self, trainer: TrainerView) -> None:
        d = self.ckpt_dir(trainer)
        if not d.is_dir():
            return
        trainer.strategy.wait_for_checkpoint()  # no write of this process is in flight: its temporary files are stale too
        me = os.getpid()
        for p in d.iterdir():
            m = _TMP_NAME.match(p.name)
            if m is None:
                continue
            pid = int(m["pid"])
            if pid == me or not _pid_alive(pid):
                trainer.strategy.remove_checkpoint(p)  # a file, or a sharded checkpoint's directory
                trainer.logger.info(f"Removed {p.name}, left by a checkpoint write that was interrupted")
