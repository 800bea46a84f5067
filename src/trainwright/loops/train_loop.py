"""Training loops: by epoch or by iteration.

One iteration runs the due ``before_train_iter`` hooks, ``model.train_step(batch, optim_wrapper)``,
records the outputs in the metric store (tensors, no sync) and runs the due ``after_train_iter``
hooks; the store flushes at agreement points. What the loops use comes in the
:class:`~trainwright.loops.context.LoopContext` given to ``run(ctx)``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from time import perf_counter as _clock
from typing import TYPE_CHECKING, Any

from trainwright.data.split import EvenEnd, is_stream, split_note
from trainwright.data.stream_state import batches_per_pass

if TYPE_CHECKING:
    from trainwright.data.loader import ResumableLoader
    from trainwright.loops.context import LoopContext
    from trainwright.loops.control import RunControl


def _checked_intervals(dynamic: Sequence[Sequence[int]] | None) -> list[Sequence[int]]:
    """``dynamic_intervals`` as given, checked: pairs of ints >= 1, milestones increasing."""
    pairs = list(dynamic or [])
    ok = all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(v, int) and v >= 1 for v in p) for p in pairs
    )
    if not ok or any(a[0] >= b[0] for a, b in zip(pairs, pairs[1:])):
        raise ValueError(
            "train_cfg dynamic_intervals must be [(milestone, interval), ...] with ints >= 1 and increasing "
            f"milestones (mmengine's), got {dynamic!r}"
        )
    return pairs


class _TrainLoopBase:
    """Shared parts of the two train loops."""

    by_epoch: bool
    #: The context of the current (or last) run, set by ``run(ctx)``; :meth:`val_due` reads it.
    ctx: LoopContext | None = None
    #: A stream under several processes: each pass ends on every rank at the same batch (set when the run starts).
    even_end: EvenEnd | None = None

    def __init__(
        self,
        dataloader: ResumableLoader,
        val_begin: int = 1,
        val_interval: int = 1,
        gather_metric_period: int = 1,
        dynamic_intervals: Sequence[Sequence[int]] | None = None,
    ) -> None:
        if batches_per_pass(dataloader) == 0:  # None: an endless stream (iteration-based training only)
            raise ValueError(
                "train_dataloader is empty (0 batches): check the dataset length, and that batch_size <= len(dataset) "
                "when drop_last=True"
            )
        if val_interval < 1:
            raise ValueError(f"val_interval must be >= 1, got {val_interval}")
        if not isinstance(gather_metric_period, int) or gather_metric_period < 1:
            raise ValueError(
                "train_cfg gather_metric_period must be an int >= 1 (record step outputs every N iterations), got "
                f"{gather_metric_period!r}"
            )
        self.dataloader = dataloader
        self.val_begin = val_begin
        self.val_interval = val_interval
        #: mmengine's ``dynamic_intervals``: ``[(milestone, interval), ...]``, the validation interval from each
        #: milestone on.
        self.dynamic_intervals = [(int(m), int(i)) for m, i in _checked_intervals(dynamic_intervals)]
        self._milestones = [0, *(m for m, _ in self.dynamic_intervals)]
        self._intervals = [val_interval, *(i for _, i in self.dynamic_intervals)]
        #: Record step outputs in the metric store every this many iterations (detectron2's ``gather_metric_period``).
        self.gather_metric_period = gather_metric_period

    @property
    def max_iters(self) -> int:
        """Total training iterations of the run."""
        raise NotImplementedError

    def interval_at(self, n: int) -> int:
        """The validation interval after ``n`` completed epochs (iterations), as mmengine decides it:
        ``dynamic_intervals``' entry for ``n + 1``."""
        return self._intervals[bisect_right(self._milestones, n + 1) - 1]

    def val_due(self) -> bool:
        """Whether validation runs right after the current iteration's / epoch's hooks."""
        raise NotImplementedError

    def _val_at(self, n: int) -> bool:
        """Whether validation is scheduled after epoch (iteration-based: iteration) ``n``."""
        raise NotImplementedError

    def _owed_validation(self, ctx: LoopContext) -> None:
        """Run the validation a resumed checkpoint owes (``progress.val_owed``: a stop came between an epoch's
        (iteration's) training and its validation), as the uninterrupted run ran it, before training goes on."""
        if not ctx.progress.val_owed or ctx.view.should_stop:
            return
        if ctx.validate is None:  # this run does not validate: nothing is owed any more
            ctx.progress.val_owed = False
            return
        self._validate(ctx, ctx.validate)

    @staticmethod
    def _validate(ctx: LoopContext, validate: Callable[[], Any]) -> None:
        """One validation pass (no longer owed: a validation loop cut short by a stop marks it owed again), then the
        agreement on a stop one of its hooks (early stopping) may have asked for."""
        ctx.progress.val_owed = False
        validate()
        ctx.metric_store.agreement.agree_finish()

    @property
    def control(self) -> RunControl:
        """The running loop's stop / restart requests (:class:`~trainwright.loops.control.RunControl`).

        Raises:
            RuntimeError: the loop is not running (no ``run(ctx)`` yet).
        """
        if self.ctx is None:
            raise RuntimeError(
                "The train loop's run control exists once the loop runs (trainer.train()); request a stop or a restart "
                "from a hook"
            )
        return self.ctx.control

    def restart_from(self, iteration: int) -> None:
        """After this iteration's hooks, go on from ``iteration``, where a hook has just restored the run
        (``control.restart_from``)."""
        self.control.restart_from(iteration)

    def request_restart(self) -> None:
        """Go on from the position ``progress`` holds now, after this iteration's hooks (:meth:`restart_from` that
        position; kept for older callers)."""
        assert self.ctx is not None
        self.restart_from(self.ctx.progress.iteration)

    def _restarted(self, ctx: LoopContext) -> bool:
        """The loop left its pass: whether that was a restart (then the hooks' schedule is rebuilt from the restored
        iteration)."""
        if ctx.control.take_restart() is None:
            return False
        ctx.hooks.refresh(ctx.view, self.max_iters, self._periodic(ctx))
        return True

    def _start(self, ctx: LoopContext) -> None:
        """``before_train``, then the hooks' per-iteration schedule for this run."""
        self.ctx = ctx
        ctx.control.reset()
        self.even_end = self._even_end(ctx)
        ctx.hooks.call("before_train", ctx.view)
        ctx.hooks.refresh(ctx.view, self.max_iters, self._periodic(ctx))

    def _even_end(self, ctx: LoopContext) -> EvenEnd | None:
        """A stream read by several processes: its passes end together (one 1-number all-gather per iteration), unless
        it never ends (``endless = True``, e.g. a Mixture)."""
        gather = ctx.metric_store.agreement.gather
        if gather is None or not is_stream(self.dataloader):
            return None
        dataset = self.dataloader.dataset
        endless = bool(getattr(dataset, "endless", False))
        ctx.logger.info(
            f"train_dataloader is a stream read by several processes: {split_note(dataset)} "
            "(train_dataloader=dict(..., split_stream=False) leaves it unsplit); "
            + (
                "it never ends (endless = True), so its end is not agreed"
                if endless
                else "each pass ends on every rank at the same batch, when the first rank's part runs out (one "
                "1-number all-gather per iteration)"
            )
        )
        return None if endless else EvenEnd(gather)

    def _finish(self, ctx: LoopContext) -> None:
        """The schedule back to every event, then ``after_train``."""
        ctx.hooks.refresh(None)
        ctx.hooks.call("after_train", ctx.view)

    def _periodic(self, ctx: LoopContext) -> list[tuple[Any, range]]:
        """The loop's own work on the hooks' schedule: the metric store's flush, where the agreed decisions are applied.

        One process: every ``flush_every``-th iteration (bounds the store's memory). Several:
        every ``agreement.every``-th, an agreement point (one collective: the numbers, a NaN -
        raised here on every process -, a stop, writing the held log lines).
        """
        store = ctx.metric_store
        agreement, control = store.agreement, ctx.control

        def flush_store(trainer: Any, batch_idx: int, data_batch: Any, outputs: Any) -> None:
            store.flush(agree=True)  # also agrees on a stop a hook requested (trainer.should_stop) on some rank
            if agreement.write:
                trainer.flush_logs()
            if agreement.stop:
                control.request_stop("a stop signal (preemption)", agreed=True)

        n = store.flush_every if agreement.local else agreement.every
        return [(flush_store, range(n, self.max_iters + 1, n))]

    def _run_iters(self, ctx: LoopContext, limit: int | None, val_every_iter: bool) -> bool:
        """Run iterations over the loader; return True if stopped early (stop request / limit).

        Pseudocode of one iteration (both loops)::

            t_start = perf_counter()
            for hook in due before_train_iter: hook(view, idx, batch)
            outputs = model.train_step(batch, optim_wrapper)   # forward, backward, maybe step
            progress.iteration += 1; progress.iter_in_epoch += 1
            record((progress.iteration, outputs, t_start, perf_counter()))   # tensors, no sync
            for hook in due after_train_iter: hook(view, idx, batch, outputs)
            (every metric_store.flush_every iterations - several processes: every agreement.every -,
             after the hooks: metric_store.flush(), the agreed decisions applied)

        ``record`` (``MetricStore.recorder``) is a list append, every N-th iteration with
        ``train_cfg=dict(gather_metric_period=N)``. Hooks with an interval
        (``Hook.train_iter_interval``) are called only when due (``hooks.schedule``: one
        comparison per step).
        """
        view = ctx.view
        progress = ctx.progress
        ow = ctx.optim_wrapper
        schedule = ctx.hooks.schedule
        before_every, after_every = schedule.before_every, schedule.after_every
        length = batches_per_pass(self.dataloader)  # None: an endless stream, whose passes have no known last batch
        last = -1 if length is None else length - 1
        train_step: Any = ctx.model.train_step
        record = ctx.metric_store.recorder(self.gather_metric_period)  # the store's list append when it is 1
        validate = ctx.validate if val_every_iter else None
        agreement = (
            ctx.metric_store.agreement
        )  # where a stop requested on some rank is agreed (the Trainer's should_stop reads it)
        even = self.even_end
        for batch in self.dataloader if even is None else even(self.dataloader):
            t_start = _clock()
            idx = progress.iter_in_epoch
            it = progress.iteration + 1
            if it >= schedule.next_due or idx == last:  # a hook with an interval is due (or the epoch ends)
                before, after = schedule.due(it, idx == last)
            else:
                before, after = before_every, after_every
            for fn in before:
                fn(view, idx, batch)
            outputs = train_step(batch, ow)
            progress.iteration = it
            progress.iter_in_epoch = idx + 1
            record(
                (it, outputs, t_start, _clock())
            )  # tensors stay tensors; the schedule flushes the store every flush_every
            if validate is not None and self._val_at(it):
                progress.val_owed = True  # a checkpoint its hooks write before the validation owes it
            for fn in after:
                fn(view, idx, batch, outputs)
            if validate is not None and progress.val_owed and not view.should_stop:
                self._validate(ctx, validate)
            if view.should_stop or (limit is not None and progress.iteration >= limit):
                return True
        if even is not None:
            if even.unread is not None:
                ctx.logger.info(even.describe(progress.iteration))
        elif length is not None and progress.iter_in_epoch != length and not agreement.local:
            self._uneven_pass(ctx)
        return False

    def _uneven_pass(self, ctx: LoopContext) -> None:
        """Several processes: this rank's loader ended its pass at another count than its ``len()``; the others would
        wait for it in a collective."""
        n, expected = ctx.progress.iter_in_epoch, len(self.dataloader)
        raise RuntimeError(
            f"train_dataloader on rank {ctx.view.strategy.rank} yielded {n} batches in this pass over the data, but "
            "its len() is "
            f"{expected}. Under several processes every rank must yield exactly len(train_dataloader) batches per "
            "pass: the other "
            "ranks would wait for this one in their next collective. Make the dataset's __len__ exact (a stream whose "
            "length is an "
            "estimate: cap or pad each rank's share to the same count)."
        )


class EpochBasedTrainLoop(_TrainLoopBase):
    """Train for ``max_epochs`` passes over the data; validate every ``val_interval`` epochs.

    When an epoch's length is not divisible by the accumulation count, its last window is
    stepped and scaled by its true size (the optim wrapper's span is reset every epoch).
    """

    by_epoch = True

    def __init__(
        self,
        dataloader: ResumableLoader,
        max_epochs: int,
        val_begin: int = 1,
        val_interval: int = 1,
        gather_metric_period: int = 1,
        dynamic_intervals: Sequence[Sequence[int]] | None = None,
    ) -> None:
        super().__init__(dataloader, val_begin, val_interval, gather_metric_period, dynamic_intervals)
        if not isinstance(max_epochs, int) or max_epochs < 1:
            raise ValueError(f"train_cfg max_epochs must be an int >= 1, got {max_epochs!r}")
        self.max_epochs = max_epochs

    @property
    def max_iters(self) -> int:
        """Total iterations: ``max_epochs * len(dataloader)``."""
        return self.max_epochs * len(self.dataloader)

    def val_due(self) -> bool:
        """After an epoch: every ``val_interval`` epochs from ``val_begin``, and after the last."""
        ctx = self.ctx
        if ctx is None or ctx.validate is None or ctx.view.should_stop:
            return False
        return self._val_at(ctx.progress.epoch)

    def _val_at(self, e: int) -> bool:
        """Whether validation is scheduled after epoch ``e``."""
        return e >= self.val_begin and (e % self.interval_at(e) == 0 or e == self.max_epochs)

    def run(self, ctx: LoopContext) -> None:
        """Run the remaining epochs (after a resume: from the saved position, the validation it owes first)."""
        self._start(ctx)
        self._owed_validation(ctx)
        view, agreement = ctx.view, ctx.metric_store.agreement
        while ctx.progress.epoch < self.max_epochs and not view.should_stop:
            self.run_epoch(ctx)
            agreement.agree_finish()  # an epoch's hooks may have asked for a stop (should_stop) on some rank
            if view.should_stop:
                if self._restarted(ctx):
                    continue
                break
            if ctx.validate is not None and ctx.progress.val_owed:
                self._validate(ctx, ctx.validate)
        ctx.metric_store.flush()
        self._finish(ctx)

    def run_epoch(self, ctx: LoopContext) -> None:
        """One epoch (or what is left of it after a mid-epoch resume)."""
        progress = ctx.progress
        ctx.hooks.call("before_train_epoch", ctx.view)
        ctx.model.train()
        ctx.optim_wrapper.initialize_count_status(ctx.model, progress.iter_in_epoch, len(self.dataloader))
        stopped = self._run_iters(ctx, None, False)
        if stopped and progress.iter_in_epoch < len(self.dataloader):
            return
        progress.epoch += 1
        progress.iter_in_epoch = 0
        # owed until the validation's pass is complete: a checkpoint written before it (a stop here) runs it on resume
        progress.val_owed = ctx.validate is not None and self._val_at(progress.epoch)
        ctx.metric_store.flush()
        ctx.hooks.call("after_train_epoch", ctx.view)


#: How often an iteration-based loop validates by default (mmengine's); the default checkpoint hook of such a run saves
#: as often.
ITER_VAL_INTERVAL = 1000


class IterBasedTrainLoop(_TrainLoopBase):
    """Train for ``max_iters`` iterations, cycling the data; validate every ``val_interval`` iterations and at the end.

    ``before_train_epoch`` / ``after_train_epoch`` fire once, around the whole run (mmengine
    semantics); ``progress.epoch`` counts the completed passes over the data (each pass
    reshuffles: the loader closes its epoch as its last batch is taken).
    """

    by_epoch = False

    def __init__(
        self,
        dataloader: ResumableLoader,
        max_iters: int,
        val_begin: int = 1,
        val_interval: int = ITER_VAL_INTERVAL,
        gather_metric_period: int = 1,
        dynamic_intervals: Sequence[Sequence[int]] | None = None,
    ) -> None:
        super().__init__(dataloader, val_begin, val_interval, gather_metric_period, dynamic_intervals)
        if not isinstance(max_iters, int) or max_iters < 1:
            raise ValueError(f"train_cfg max_iters must be an int >= 1, got {max_iters!r}")
        self._max_iters = max_iters

    @property
    def max_iters(self) -> int:
        """Total iterations of the run."""
        return self._max_iters

    def val_due(self) -> bool:
        """After an iteration: every ``val_interval`` iterations from ``val_begin``, and at ``max_iters``."""
        ctx = self.ctx
        if ctx is None or ctx.validate is None or ctx.view.should_stop:
            return False
        return self._val_at(ctx.progress.iteration)

    def _val_at(self, it: int) -> bool:
        """Whether validation is scheduled after iteration ``it``."""
        return it >= self.val_begin and (it % self.interval_at(it) == 0 or it == self._max_iters)

    def run(self, ctx: LoopContext) -> None:
        """Run until ``max_iters`` (after a resume: the remaining ones)."""
        self._start(ctx)
        view, progress = ctx.view, ctx.progress
        ctx.hooks.call("before_train_epoch", view)
        ctx.model.train()
        ctx.optim_wrapper.initialize_count_status(ctx.model, progress.iteration, self._max_iters)
        self._owed_validation(ctx)
        while progress.iteration < self._max_iters and not view.should_stop:
            if not self._run_iters(ctx, self._max_iters, ctx.validate is not None):
                progress.epoch += 1  # a pass over the data ended (the loader closed its epoch too)
                progress.iter_in_epoch = 0
            elif view.should_stop and self._restarted(ctx):
                ctx.optim_wrapper.initialize_count_status(ctx.model, progress.iteration, self._max_iters)
        ctx.metric_store.flush()
        ctx.hooks.call("after_train_epoch", view)
        self._finish(ctx)
