"""LogProcessor: what a training record averages over (``window_size``) and which statistics it adds (``custom_cfg``).

mmengine's ``log_processor=dict(window_size=..., custom_cfg=[...])``. The logger hook gives its
processor to the held lines when training starts (:meth:`PendingLines.start
<trainwright.logging.lines.PendingLines.start>`); the lines ask it, per record, where the
averaged interval starts and what the custom statistics are. It holds settings only: the
numbers stay in the metric store.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from trainwright.logging.metric_store import MetricStore

__all__ = ["CustomStat", "LogProcessor"]

_CUSTOM_KEYS = {"data_src", "method_name", "window_size", "log_name"}
_METHODS = ("mean", "min", "max", "current")


class CustomStat(NamedTuple):
    """One more number in each training record (an entry of mmengine's ``log_processor.custom_cfg``).

    ``method_name`` (``"mean"``, ``"min"``, ``"max"``, ``"current"``) of the logged scalar
    ``data_src`` over ``window_size``: a number of iterations ending at the line's, ``"epoch"``
    (this epoch's iterations so far) or ``"global"`` (the run's, ``"mean"`` only); None: the
    line's own iterations. Written as ``log_name`` (default: ``data_src``, replacing it).
    """

    data_src: str
    method_name: str = "mean"
    window_size: int | str | None = None
    log_name: str | None = None


class LogProcessor:
    """How training records are computed from the metric store's values: the averaging window and custom statistics.

    Args:
        window_size: Losses and times are averaged over this many iterations ending at each
            line (mmengine's ``log_processor.window_size``; lines then overlap or skip
            iterations, as mmengine's); None (default): over the line's own iterations.
        custom_cfg: More numbers per record, each ``dict(data_src=..., method_name="mean" |
            "min" | "max" | "current", window_size=int | "epoch" | "global", log_name=...)``
            (see :class:`CustomStat`).
        owner: Who is configured, for the error messages (e.g. ``"LoggerHook"``).

    Raises:
        ValueError: ``window_size`` is not None or an int >= 1, or a ``custom_cfg`` entry is
            malformed (the message names the entry and the fix).
    """

    def __init__(
        self,
        window_size: int | None = None,
        custom_cfg: Sequence[Mapping[str, Any]] | None = None,
        owner: str = "log_processor",
    ) -> None:
        if window_size is not None and (
            isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1
        ):
            raise ValueError(
                f"{owner} window_size must be None (the line's own iterations) or an int >= 1, got {window_size!r}"
            )
        #: Iterations each line's losses and times are averaged over (None: the line's own).
        self.window_size = window_size
        #: The custom statistics, checked.
        self.custom: tuple[CustomStat, ...] = tuple(_custom_stat(owner, i, c) for i, c in enumerate(custom_cfg or ()))

    def history(self, epoch_len: int) -> int:
        """How many iterations before a line its values reach back (its window, a custom statistic's).

        ``epoch_len`` is the iterations of an epoch (an ``"epoch"`` statistic's window).
        """
        windows = [w for w in (self.window_size, *(c.window_size for c in self.custom)) if isinstance(w, int)]
        windows += [epoch_len for c in self.custom if c.window_size == "epoch"]
        return max(windows, default=0)

    def window_start(self, since: int, iteration: int) -> int:
        """The iteration after which the line of ``iteration`` averages (no window: ``since``, the previous line's)."""
        return since if self.window_size is None else max(iteration - self.window_size, 0)

    def custom_values(self, store: MetricStore, iteration: int, since: int, in_epoch: int) -> dict[str, float]:
        """The custom statistics of the line of ``iteration`` (previous line at ``since``; ``in_epoch`` into its epoch).

        A statistic without a value of its ``data_src`` in its window is left out.
        """
        out = {}
        for c in self.custom:
            value = _custom(c, store, iteration, since, in_epoch)
            if value is not None:
                out[c.log_name or c.data_src] = value
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(window_size={self.window_size}, custom={list(self.custom)})"


def _custom(c: CustomStat, store: MetricStore, hi: int, since: int, in_epoch: int) -> float | None:
    """The value of one custom statistic for the line of ``hi`` (None: no value of ``c.data_src`` in the window)."""
    if c.data_src not in store:
        return None
    buf = store.get(c.data_src)
    iters, values = buf.history()
    b = bisect.bisect_right(iters, hi)
    if c.window_size == "global":  # every value up to the line's iteration, from the running sum
        after = values[b:]
        n = buf.count - len(after)
        return (buf.global_avg * buf.count - sum(after)) / n if n > 0 else None
    if c.window_size is None:
        lo = since
    elif c.window_size == "epoch":
        lo = hi - in_epoch
    else:
        lo = hi - int(c.window_size)
    window = values[bisect.bisect_right(iters, lo) : b]
    if not window:
        return None
    if c.method_name == "mean":
        return sum(window) / len(window)
    if c.method_name == "min":
        return min(window)
    if c.method_name == "max":
        return max(window)
    return window[-1]  # "current"


def _custom_stat(owner: str, i: int, cfg: Mapping[str, Any]) -> CustomStat:
    """One ``custom_cfg`` entry checked (mmengine's rules), with a message naming the entry and the fix."""
    where = f"{owner} custom_cfg[{i}]"
    if not isinstance(cfg, Mapping) or "data_src" not in cfg:
        raise ValueError(f"{where} must be a dict with at least data_src (the logged name, e.g. 'loss'), got {cfg!r}")
    bad = set(cfg) - _CUSTOM_KEYS
    if bad:
        raise ValueError(f"{where}: unknown keys {sorted(bad)}; allowed: {sorted(_CUSTOM_KEYS)}")
    method = cfg.get("method_name", "mean")
    if method not in _METHODS:
        raise ValueError(f"{where}: method_name must be one of {list(_METHODS)}, got {method!r}")
    window = cfg.get("window_size")
    if not (
        window is None
        or window in ("epoch", "global")
        or (isinstance(window, int) and not isinstance(window, bool) and window >= 1)
    ):
        raise ValueError(f"{where}: window_size must be an int >= 1, 'epoch' or 'global', got {window!r}")
    if window == "global" and method != "mean":
        raise ValueError(
            f"{where}: window_size='global' supports method_name='mean' only (the run's values are kept as a running "
            "sum); use 'epoch' or a number"
        )
    return CustomStat(str(cfg["data_src"]), method, window, cfg.get("log_name"))
