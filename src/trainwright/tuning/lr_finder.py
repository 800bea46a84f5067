"""The learning-rate range test (Lightning's ``Tuner.lr_find``): ramp the lr over real training steps, record the
smoothed loss.

:func:`find_lr` runs ``num_steps`` optimizer updates on the trainer's train loader, through the
run's one update path (``model.train_step`` → ``OptimWrapper.update_params`` → the strategy),
the lr set on every param group before each update; it stops early when the smoothed loss
passes ``diverge`` times the best so far, and puts the trainer back bitwise afterwards
(:func:`~trainwright.tuning.state.preserved`). :class:`LRFinderResult` holds the curve, the
suggestion (the steepest descent of the smoothed loss) and draws it. See docs/diagnose.md.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainwright.optim.optim_wrapper_dict import optim_wrappers_of
from trainwright.tuning.lr_range import MODES, LRRange, check_lr_args
from trainwright.tuning.state import TunableTrainer, preserved


def ramp(min_lr: float, max_lr: float, num_steps: int, mode: str) -> list[float]:
    """The ``num_steps`` learning rates of the test: ``min_lr`` first, ``max_lr`` last; geometric (``"exp"``) or
    evenly spaced (``"linear"``)."""
    n = num_steps - 1
    if MODES[mode] == "exp":
        return [min_lr * (max_lr / min_lr) ** (i / n) for i in range(num_steps)]
    return [min_lr + (max_lr - min_lr) * i / n for i in range(num_steps)]


@dataclass
class LRFinderResult:
    """The outcome of :func:`find_lr`: one point per update, in order.

    Attributes:
        lrs: The learning rate of each update (of the optimizer's default lr; groups keep their ratios to it).
        losses: The smoothed loss after each update (NaN where the loss was not finite: the test stopped there).
        raw_losses: The loss of each update as the model returned it (the mean over an accumulation window).
        mode: ``"exp"`` or ``"linear"``.
        stopped_early: True when the loss diverged (or was not finite) before ``num_steps``.
    """

    lrs: list[float]
    losses: list[float]
    raw_losses: list[float]
    mode: str = "exp"
    stopped_early: bool = False
    _index: int | None = field(default=None, init=False, repr=False, compare=False)

    def suggest(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The lr of the steepest descent of the smoothed loss before its minimum: ``argmin`` of its gradient along the
        ramp.

        The first ``skip_begin`` and the last ``skip_end`` points, the non-finite ones and those
        past the smoothed loss's minimum are left out (Lightning's defaults, and fastai's
        "valley": past the minimum the ramp is diverging, and a spike there followed by a lucky
        batch would look like the steepest descent). The gradient is ``torch.gradient(losses, spacing=[x])``
        with ``x = log10(lr)`` for the exponential ramp (the axis it is drawn on, where its
        points are evenly spaced: Lightning 1.x's ``np.gradient(losses)``) and ``x = lr`` for the
        linear one. Lightning 2.x takes ``x = lr`` for both; on an exponential ramp that divides
        the first points' noise by their tiny lr steps, so it tends to pick the smallest lrs.
        None when fewer than two points remain (raise ``num_steps``, or the loss diverged at once).
        """
        n = len(self.losses)
        idx = [i for i in range(skip_begin, n - skip_end) if math.isfinite(self.losses[i])]
        if idx:
            lowest = min(idx, key=lambda i: self.losses[i])
            idx = [i for i in idx if i <= lowest]
        if len(idx) < 2:
            return None
        losses = torch.tensor([self.losses[i] for i in idx], dtype=torch.float64)
        x = torch.tensor([self.lrs[i] for i in idx], dtype=torch.float64)
        if self.mode == "exp":
            x = torch.log10(x)
        grads = torch.gradient(losses, spacing=[x])[0]
        self._index = idx[int(torch.argmin(grads))]
        return self.lrs[self._index]

    @property
    def suggestion(self) -> float | None:
        """:meth:`suggest` with Lightning's defaults (``skip_begin=10``, ``skip_end=1``)."""
        return self.suggest()

    def plot(self, path: str | Path) -> Path:
        """Draw the smoothed loss against the lr (log scale for the exponential ramp), the suggestion marked; write a
        PNG to ``path``.

        Raises:
            ImportError: matplotlib is not installed (``pip install matplotlib``).
        """
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError(
                f"LRFinderResult.plot needs matplotlib ({e}); install it with `pip install matplotlib`"
            ) from e
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(6, 4))
        try:
            ax.plot(self.lrs, self.losses, label="smoothed loss")
            if self.mode == "exp":
                ax.set_xscale("log")
            ax.set_xlabel("learning rate")
            ax.set_ylabel("loss")
            best = self.suggestion
            if best is not None and self._index is not None:
                ax.plot(
                    [best],
                    [self.losses[self._index]],
                    marker="o",
                    markersize=9,
                    color="red",
                    linestyle="none",
                    label=f"suggestion {best:.3g}",
                )
            ax.legend()
            fig.tight_layout()
            fig.savefig(path, format="png")
        finally:
            plt.close(fig)
        return path


def _batches(loader: Any) -> Generator[Any, None, None]:
    """The loader's batches, starting a new pass whenever one ends (the position is restored afterwards)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:  # a pass can be empty once (a loader saved right after its epoch's last batch); twice means no data
            for batch in loader:
                empty = False
                yield batch
            if empty:
                raise ValueError("find_lr: the train_dataloader yields no batches")


def _group_ratios(trainer: TunableTrainer) -> list[tuple[dict[str, Any], float]]:
    """``(param group, ratio)`` for every group of every optimizer: the group's lr over its optimizer's default lr.

    A group's lr is read as the schedulers' ``initial_lr`` when they set one (a warm-up scales
    ``lr`` itself), so per-parameter multipliers (``paramwise_cfg`` lr_mult) keep their ratios.
    """
    out = []
    for ow in optim_wrappers_of(trainer.optim_wrapper).values():
        default = ow.optimizer.defaults.get("lr")
        for g in ow.optimizer.param_groups:
            own = g.get("initial_lr", g["lr"])
            out.append((g, float(own) / float(default) if isinstance(default, (int, float)) and default > 0 else 1.0))
    return out


def find_lr(
    trainer: TunableTrainer,
    min_lr: float = LRRange.min_lr,
    max_lr: float = LRRange.max_lr,
    num_steps: int = LRRange.num_steps,
    mode: str = LRRange.mode,
    smooth: float = LRRange.smooth,
    diverge: float | None = LRRange.diverge,
) -> LRFinderResult:
    """Run the lr range test on a trainer whose train parts are built (``Trainer.find_lr`` builds them); the trainer is
    put back after.

    Each of the ``num_steps`` updates uses the ramp's next lr (every param group: that lr
    times the group's ratio to the optimizer's default lr) over ``accumulative_counts``
    micro-batches of the train loader. The smoothed loss is Lightning's bias-corrected running
    mean, ``avg = (1 - smooth) * avg + smooth * loss; smoothed = avg / (1 - (1 - smooth) ** (i + 1))``
    (``smooth=0.05`` is Lightning's ``beta=0.95``); the test stops after the update whose
    smoothed loss exceeds ``diverge`` x the lowest so far (from the second update on), or
    whose loss is not finite. No hook runs, nothing is logged per step or written, and the
    schedulers do not step. Under several processes every process runs it (the losses are
    averaged over processes, so all stop together).
    """
    mode = check_lr_args(min_lr, max_lr, num_steps, mode, smooth, diverge)
    lrs_planned = ramp(min_lr, max_lr, num_steps, mode)
    model, ow, strategy = trainer.model, trainer.optim_wrapper, trainer.strategy
    wrappers = optim_wrappers_of(ow)
    acc = max(w.accumulative_counts for w in wrappers.values())
    beta = 1.0 - smooth
    lrs: list[float] = []
    losses: list[float] = []
    raw: list[float] = []
    stopped = False
    with preserved(trainer):
        groups = _group_ratios(trainer)
        model.train()
        for w in wrappers.values():
            w.initialize_count_status(model, 0, num_steps * w.accumulative_counts)
        batches = _batches(trainer.train_loop.dataloader)
        train_step: Any = model.train_step
        avg, best = 0.0, math.inf
        try:
            for i, lr in enumerate(lrs_planned):
                for g, ratio in groups:
                    if isinstance(g["lr"], torch.Tensor):  # a tensor lr (capturable optimizers) stays one
                        g["lr"].fill_(lr * ratio)
                    else:
                        g["lr"] = lr * ratio
                total = None
                for _ in range(acc):
                    out = train_step(next(batches), ow)
                    loss = out["loss"] if isinstance(out, dict) and "loss" in out else None
                    if not isinstance(loss, torch.Tensor):
                        raise TypeError(
                            f"find_lr needs the loss of each step: train_step returned {type(out).__name__} without a "
                            "'loss' tensor; return dict(loss=...) from forward(mode='loss')"
                        )
                    total = loss.detach().float() if total is None else total + loss.detach().float()
                assert total is not None
                mean = total / acc
                if strategy.world_size > 1:
                    mean = strategy.reduce(mean, "mean")
                value = float(mean)  # one host sync per update: the stop decision needs the number
                lrs.append(lr)
                raw.append(value)
                if not math.isfinite(value):
                    losses.append(math.nan)
                    stopped = i < num_steps - 1
                    break
                avg = beta * avg + smooth * value
                smoothed = avg / (1.0 - beta ** (i + 1))
                losses.append(smoothed)
                if diverge is not None and i > 0 and smoothed > diverge * best:
                    stopped = i < num_steps - 1
                    break
                best = min(best, smoothed)
        finally:
            batches.close()  # the loader's pass ends here (its workers stop) before its position is restored
    result = LRFinderResult(lrs, losses, raw, mode, stopped)
    suggestion = result.suggestion
    if suggestion is not None:
        said = f"; suggested lr {suggestion:.3g}"
    elif stopped and len(raw) > 1 and len(raw) <= _EARLY:
        said = (
            f"; no suggestion: the loss jumped at update {len(raw)} (lr {lrs[-1]:.3g}: {raw[-1]:.4g} against "
            f"{min(raw[:-1]):.4g} before), so early in "
            "the ramp that one outlier batch is the likelier cause than the lr; look at that batch, or pass "
            "diverge=None (or a higher "
            "diverge) to ramp past it"
        )
    else:
        said = "; no suggestion (too few points: raise num_steps, or lower max_lr)"
    trainer.logger.info(
        f"LR finder: {len(lrs)} of {num_steps} updates, lr {min_lr:g} to {lrs[-1]:g}"
        + (" (stopped: the loss diverged)" if stopped else "")
        + said
        + ". The trainer was put back as it was."
    )
    return result


#: A divergence within this many updates is blamed on a batch, not on the lr (the suggestion skips the first 10 points).
_EARLY = 12
