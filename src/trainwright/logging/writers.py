"""Writers: where logged numbers go (the console, ``metrics.jsonl``; CSV, TensorBoard, W&B, MLflow in their own
    modules).

The logger hook builds each training record once and hands the same objects to every
writer of ``trainer.writers``, a :class:`Writers` list: its methods are the one fan-out
point, where a writer that raises is reported and disabled (or its error held until the
checkpoint due is written), so a writer never costs a checkpoint. Only the main process has
writers - the trainer builds the list there and nowhere else - so no writer ever checks the rank.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import inspect
import json
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

from trainwright.logging.append import AppendFile
from trainwright.logging.logger import log_lines
from trainwright.logging.resume import Resumed, replace_text
from trainwright.registry import check_keys, did_you_mean

_META = ("mode", "epoch", "iter")


class LineInfo(NamedTuple):
    """What a training line shows besides its record: when and where in the run it was logged."""

    created: float  # time.time() at the iteration: the line's timestamp
    batch: int  # position of the iteration in its epoch, 1-based
    by_epoch: bool
    epoch_len: int  # iterations per epoch
    max_iters: int  # iterations of the whole run (for the ETA)


@runtime_checkable
class Writer(Protocol):
    """A destination for logged numbers. Subclass it and override what you need; the rest do nothing.

    Records are plain dicts, the same as the lines of ``metrics.jsonl``: training records
    ``{"mode": "train", "epoch", "iter", <losses and other outputs>, <lr names>, "grad_norm",
    "loss_scale", "time", "data_time"}`` (keys present when logged) and evaluation records
    ``{"mode": "val" | "test", "epoch", "iter", <metrics>}``. Writers run on the main
    process only.
    """

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:
        """Training records of logging iterations, oldest first; several at once when lines are batched."""
        return None

    def write_eval(self, record: dict[str, Any]) -> None:
        """The metrics of one validation or test pass."""
        return None

    def write_config(self, config: dict[str, Any]) -> None:
        """The trainer's resolved settings (plain values), once, when the trainer is built."""
        return None

    def flush(self) -> None:
        """Make everything written so far visible (on disk, on the server)."""
        return None

    def close(self) -> None:
        """Release files and connections; nothing is written afterwards."""
        return None


@runtime_checkable
class Resuming(Protocol):
    """A writer that continues the logs of the runs a resumed run continues (every stock writer that keeps files or a
    tracker run).

    A writer of your own adds a ``resume`` method to take part; :class:`Writers` calls it on the
    writers that have one.
    """

    def resume(self, at: Resumed) -> None:
        """This run resumed from a checkpoint at ``at.iteration``: continue the logs of the runs it resumes.

        Called once, before this run's first training record. What earlier runs (``at.earlier``,
        a killed one) wrote past the iteration is superseded, since this run logs those
        iterations again: a file is cut back to it, a tracker continues the same run.
        """
        ...


def scalars(record: dict[str, Any]) -> list[tuple[str, float]]:
    """The numbers of a record without its ``mode`` / ``epoch`` / ``iter`` keys, as ``(key, value)`` pairs (for
    backends)."""
    return [(k, float(v)) for k, v in record.items() if k not in _META and isinstance(v, (int, float))]


def import_backend(module: str, extra: str, writer: str) -> Any:
    """Import the optional package ``module`` of a writer, or fail with the command that installs it.

    Raises:
        ImportError: ``module`` is not installed; the message names ``pip install 'trainwright[<extra>]'``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"The {writer!r} writer needs the package {module.split('.')[0]!r}, which is not installed ({e}). "
            f"Install it with: pip install 'trainwright[{extra}]'  (or drop {writer!r} from writers=[...])"
        ) from e


# -- metrics.jsonl ----------------------------------------------------------------------------
_encode_strict = json.JSONEncoder(allow_nan=False).encode


def _encode(record: dict[str, Any]) -> str:
    try:
        return _encode_strict(record)
    except ValueError:  # a NaN / Inf value
        return _encode_strict(_finite(record))


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with non-finite floats as strings ("nan", "inf"): JSON has no such numbers."""
    for v in record.values():
        if isinstance(v, float) and not math.isfinite(v):
            return {k: (str(x) if isinstance(x, float) and not math.isfinite(x) else x) for k, x in record.items()}
    return record


class JsonlWriter(Writer):
    """Appends one JSON object per record to ``path`` (``metrics.jsonl``).

    Lines reach the file at most ``flush_secs`` after they are written (and always on
    :meth:`flush` / :meth:`close`), whole lines at a time through
    :class:`~trainwright.logging.append.AppendFile`: a full disk costs lines (with a warning
    naming the file, at once), never a torn JSON line, and training goes on. No descriptor
    is held between flushes.
    """

    def __init__(self, path: str | Path, flush_secs: float = 1.0) -> None:
        self.path = Path(path)
        self.flush_secs = flush_secs
        self._file = AppendFile(self.path, "metric records")
        self._last_flush = 0.0

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:  # noqa: D102
        self.write_many(records)

    def write_eval(self, record: dict[str, Any]) -> None:  # noqa: D102
        self.write_many([record])

    def resume(self, at: Resumed) -> None:
        """Cut this file and the ``metrics.jsonl`` of each earlier run folder back to ``at.iteration`` (records past it
        are superseded; each file replaced atomically)."""
        self.flush()
        for path in at.places(self.path):
            cut_jsonl(path, at.iteration)

    def write_many(self, records: list[dict[str, Any]]) -> None:
        """Append records (non-finite floats written as strings "nan"/"inf")."""
        self._file.write("".join([_encode(r) + "\n" for r in records]))
        now = time.monotonic()
        if now - self._last_flush >= self.flush_secs:
            self.flush()

    def flush(self) -> None:
        """Append the buffered lines to the file."""
        self._file.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Write what is buffered (the file holds no descriptor between writes)."""
        self.flush()


def cut_jsonl(path: Path, iteration: int) -> bool:
    """Drop the records of ``path`` (JSON lines) whose ``iter`` is past ``iteration``, and lines cut short by a crash;
    the file is replaced atomically, and only when something is dropped. A file without training records (a
    standalone evaluation's, whose iteration is that of the weights it loaded) is left as it is.

    Returns:
        Whether the file changed.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        return False
    kept, trained = [], False
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line: no reader can use it
        trained = trained or (isinstance(rec, dict) and rec.get("mode") == "train")
        if not (isinstance(rec, dict) and isinstance(rec.get("iter"), int) and rec["iter"] > iteration):
            kept.append(line if line.endswith("\n") else line + "\n")
    if not trained or (len(kept) == len(lines) and all(a == b for a, b in zip(kept, lines))):
        return False
    replace_text(path, "".join(kept))
    return True


# -- console and train.log --------------------------------------------------------------------
def _template(keys: tuple[str, ...]) -> str:
    """``"  loss: {:.4f}  lr: {:.4e}  eta: {}  ..."`` for records with these keys (the first three are meta)."""
    parts = []
    for k in keys[len(_META) :]:
        lr = k.endswith("lr")  # lr, base_lr, gen.lr: scientific notation (mmengine)
        parts.append(f"  {k}: {{:.4e}}" if lr else f"  {k}: {{:.4f}}")
        if k == "lr" and "time" in keys:
            parts.append("  eta: {}")
    return "".join(parts)


class ConsoleWriter(Writer):
    """Log lines through the trainer's logger (stdout and ``train.log``).

    Training lines look like ``Epoch(train) [1][ 30/100]  loss: 0.1234  lr: 1.0000e-02  eta:
    0:00:12  time: 0.0123  data_time: 0.0012`` (``Iter(train) [30/1000]`` for iteration-based
    runs), rendered from cached per-key templates and written in one batch per call, each
    dated by its iteration; evaluation results as ``Epoch(val) [1] iter 100  acc: 0.9700``.

    Args:
        logger: The logger to write to; its handlers belong to the trainer (closed there).
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._templates: dict[tuple[str, ...], str] = {}

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:  # noqa: D102
        log_lines(
            self.logger,
            [self._format(rec, info) for rec, info in zip(records, lines)],
            created=[info.created for info in lines],
        )

    def write_eval(self, record: dict[str, Any]) -> None:  # noqa: D102
        shown = "  ".join(f"{k}: {v:.4f}" for k, v in record.items() if k not in _META)
        self.logger.info(f"Epoch({record['mode']}) [{record['epoch']}] iter {record['iter']}  {shown}")

    def flush(self) -> None:  # noqa: D102
        for h in self.logger.handlers:
            h.flush()

    def _format(self, rec: dict[str, Any], info: LineInfo) -> str:
        if info.by_epoch:
            head = f"Epoch(train) [{rec['epoch']}][{str(info.batch).rjust(len(str(info.epoch_len)))}/{info.epoch_len}]"
        else:
            head = f"Iter(train) [{str(rec['iter']).rjust(len(str(info.max_iters)))}/{info.max_iters}]"
        keys = tuple(rec)
        template = self._templates.get(keys)
        if template is None:
            template = self._templates[keys] = _template(keys)
        values = [v for k, v in rec.items() if k not in _META]
        if "lr" in rec and "time" in rec:  # the ETA follows the lr
            values.insert(
                keys.index("lr") - len(_META) + 1,
                datetime.timedelta(seconds=int(rec["time"] * (info.max_iters - rec["iter"]))),
            )
        return head + template.format(*values)


# -- the fan-out point -------------------------------------------------------------------------
#: What ``Trainer(writers_fail=...)`` accepts.
WRITERS_FAIL = ("warn", "raise")


@runtime_checkable
class SaveAhead(Protocol):
    """The question a held writer error waits on: may a checkpoint save still follow at this point of the run?

    ``Writers(fail="raise")`` keeps a writer's error while the answer is yes, so the checkpoint
    due at that point is written before the run stops. The checkpoint side answers it (it knows
    its policy); the trainer gives the answering object to the writers it builds.
    """

    def save_may_follow(self) -> bool:
        """Whether a checkpoint save may still follow at the current point of the run."""
        ...


class AnyAhead:
    """A :class:`SaveAhead` answered yes when any of ``answerers`` that answers the question says yes (the others are
    skipped).

    The trainer gives its hooks: the one that keeps the checkpoint policy answers; without one the answer is no.
    """

    def __init__(self, answerers: Iterable[object]) -> None:
        self.answerers = answerers  # read when asked: a hook registered later answers too

    def save_may_follow(self) -> bool:
        """Whether any answerer says a checkpoint save may still follow now."""
        return any(a.save_may_follow() for a in self.answerers if isinstance(a, SaveAhead))


@runtime_checkable
class WriterSource(Protocol):
    """Something that brings a writer of its own (the progress bar shows each record's loss); whoever builds the writers
    adds it.

    :func:`build_writers` adds the :meth:`records_writer` of each source it is given after the
    configured writers (the trainer gives its hooks): nothing appends itself to a run's writers.
    """

    def records_writer(self, logger: logging.Logger) -> Writer | None:
        """The writer to add to the run's writers, which log through ``logger`` (None: none)."""
        ...


class WriterError(RuntimeError):
    """A writer raised (``writers_fail="raise"``); raised after the checkpoint due at that point was written.

    Attributes:
        writer: The writer that failed.
    """

    def __init__(self, message: str, writer: Writer) -> None:
        super().__init__(message)
        self.writer = writer


class Writers(list[Writer]):
    """The writers of a run, and the one point where records fan out to them.

    A list of :class:`Writer` objects (index, iterate, ``append`` as any list); its
    :meth:`write_train`, :meth:`write_eval`, :meth:`write_config`, :meth:`flush` and
    :meth:`close` call each writer in turn, and a writer that raises never stops the others
    nor the caller:

    * ``fail="warn"`` (default): the error is reported once - in the log (``train.log``) and as a
      warning (stderr) - naming the writer and the error, and the writer gets nothing more
      (except :meth:`close`). Training and its checkpoints go on.
    * ``fail="raise"``: reported the same way, then raised as a :class:`WriterError` once
      every writer was served - unless a checkpoint may be due at this point: while
      ``ahead`` says so (:class:`SaveAhead`, answered by the checkpoint side) or inside
      :meth:`holding` (the flush before a checkpoint is written), the error is kept until
      :meth:`raise_held` (the checkpoint hook calls it after its save) or the next call
      outside such a point.

    Args:
        writers: The writers.
        logger: Where failures are reported (the trainer's logger); None: warnings only.
        fail: ``"warn"`` or ``"raise"``.
        ahead: Asked, after a ``"raise"`` error, whether a checkpoint save may still follow at
            this point (the error then waits for :meth:`raise_held`); None: never.
    """

    def __init__(
        self,
        writers: Iterable[Writer] = (),
        logger: logging.Logger | None = None,
        fail: str = "warn",
        ahead: SaveAhead | None = None,
    ) -> None:
        super().__init__(writers)
        if fail not in WRITERS_FAIL:
            raise ValueError(
                "writers_fail must be 'warn' (report a failing writer and disable it) or 'raise' (stop the run after "
                f"the due checkpoint), got {fail!r}"
            )
        self.logger = logger
        self.fail = fail
        self.ahead = ahead
        #: Deprecated (use ``ahead``): a predicate telling whether a checkpoint may be due at this point; None: never.
        self.hold: Callable[[], bool] | None = None
        self._holding = 0
        self._failed: dict[int, BaseException] = {}  # id(writer) -> its error: it gets nothing more
        self._held: WriterError | None = None

    @property
    def failed(self) -> list[tuple[Writer, BaseException]]:
        """The writers that raised, with their errors (they are called no more, :meth:`close` apart)."""
        return [(w, self._failed[id(w)]) for w in self if id(w) in self._failed]

    def write_train(self, records: list[dict[str, Any]], lines: list[LineInfo]) -> None:
        """:meth:`Writer.write_train` of every writer that has not failed."""
        self._each("write_train", records, lines)

    def write_eval(self, record: dict[str, Any]) -> None:
        """:meth:`Writer.write_eval` of every writer that has not failed."""
        self._each("write_eval", record)

    def write_config(self, config: dict[str, Any]) -> None:
        """:meth:`Writer.write_config` of every writer that has not failed."""
        self._each("write_config", config)

    def resume(self, at: Resumed) -> None:
        """:meth:`Resuming.resume` of every writer that has one and has not failed (the logger hook calls it when a run
        resumed)."""
        self._each("resume", at, only=Resuming)

    def flush(self) -> None:
        """:meth:`Writer.flush` of every writer that has not failed."""
        self._each("flush")

    def close(self) -> None:
        """:meth:`Writer.close` of every writer, failed ones included (to release their files); an error there is
        logged, never raised."""
        for w in list(self):
            try:
                w.close()
            except Exception as e:  # noqa: BLE001 - closing one writer must not keep the others open
                if id(w) not in self._failed and self.logger is not None:
                    self.logger.warning(f"Writer {_name(w)} failed while closing: {type(e).__name__}: {e}")

    def raise_held(self) -> None:
        """Raise the held error of a failed writer (``fail="raise"``), once; nothing when none is held."""
        held, self._held = self._held, None
        if held is not None:
            raise held

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Keep a ``"raise"`` error inside this block (e.g. the flush before a checkpoint): :meth:`raise_held` raises
        it later."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1

    def _each(self, method: str, *args: Any, only: type | None = None) -> None:
        for w in list(self):
            if id(w) in self._failed or (only is not None and not isinstance(w, only)):
                continue
            try:
                getattr(w, method)(*args)
            except Exception as e:  # noqa: BLE001 - a writer must never cost the run (see the class docstring)
                self._report(w, method, e)
        if self._held is not None and not self._holding and not self._save_ahead():
            self.raise_held()

    def _save_ahead(self) -> bool:
        """Whether a checkpoint save may follow now (``ahead``'s answer, or the deprecated ``hold`` predicate's)."""
        if self.ahead is not None and self.ahead.save_may_follow():
            return True
        return self.hold is not None and self.hold()

    def _report(self, w: Writer, method: str, e: Exception) -> None:
        self._failed[id(w)] = e
        what = f"Writer {_name(w)} failed in {method}: {type(e).__name__}: {e}."
        if self.fail == "warn":
            msg = (
                f"{what} It gets no more records in this run; the other writers and training go on. Pass "
                "Trainer(writers_fail='raise') to stop the run instead (after the checkpoint due), or fix or remove "
                "the writer."
            )
        else:
            msg = f"{what} writers_fail='raise': the run stops here, once a checkpoint due at this point is written."
            if self._held is None:
                self._held = WriterError(msg, w)
                self._held.__cause__ = e
        if self.logger is not None:
            self.logger.error(msg, exc_info=e)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


def _name(w: Writer) -> str:
    return type(w).__name__


# -- by name ----------------------------------------------------------------------------------
#: ``factory(run_dir, logger, **kwargs) -> Writer``: what a writer name builds.
WriterFactory = Callable[..., Writer]


def _call(name: str, fn: Callable[..., Writer], *args: Any, **kwargs: Any) -> Writer:
    """``fn(*args, **kwargs)`` after checking that ``fn`` takes every keyword (unknown ones are named, with the
    closest match)."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        allowed = [k for k, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)][len(args) :]
        check_keys(f"writer {name!r}", kwargs, allowed, error=TypeError, hint=f"Its arguments: {allowed}")
    return fn(*args, **kwargs)


def _lazy(name: str, module: str, cls: str, subdir: str) -> WriterFactory:
    """Build ``trainwright.logging.<module>.<cls>(run_dir / subdir, **kwargs)``, importing the module only then
    (optional packages)."""

    def factory(run_dir: Path, logger: logging.Logger, **kwargs: Any) -> Writer:
        return _call(
            name, getattr(importlib.import_module(f"trainwright.logging.{module}"), cls), run_dir / subdir, **kwargs
        )

    return factory


#: Writers that ``Trainer(writers=[...])`` accepts by name (``"csv"``) or as a dict
#: (``dict(type="csv", ...)``, the other keys are the writer's arguments):
#: name → ``factory(run_dir, logger, **kwargs)``. Backends of optional packages are imported
#: only when built.
WRITERS: dict[str, WriterFactory] = {
    "console": lambda run_dir, logger, **kwargs: _call("console", ConsoleWriter, logger, **kwargs),
    "jsonl": lambda run_dir, logger, **kwargs: _call("jsonl", JsonlWriter, run_dir / "metrics.jsonl", **kwargs),
    "csv": _lazy("csv", "csv_writer", "CsvWriter", "csv"),
    "tensorboard": _lazy("tensorboard", "tensorboard_writer", "TensorBoardWriter", "tensorboard"),
    "wandb": _lazy("wandb", "wandb_writer", "WandbWriter", ""),
    "mlflow": _lazy("mlflow", "mlflow_writer", "MlflowWriter", "mlflow"),
}

#: What ``Trainer(writers=None)`` uses.
DEFAULT_WRITERS = ("console", "jsonl")


def build_writers(
    spec: Sequence[Writer | str | Mapping[str, Any]] | None,
    run_dir: Path,
    logger: logging.Logger,
    sources: Iterable[object] = (),
) -> list[Writer]:
    """The writers of a run: ``None`` gives the defaults; a list replaces them; then the writers ``sources`` bring.

    Args:
        spec: None, or a list of :class:`Writer` objects, names of :data:`WRITERS` and dicts
            ``dict(type=<name>, **arguments)`` (``["console", "jsonl", "tensorboard",
            dict(type="wandb", project="demo"), MyWriter()]`` keeps both defaults and adds three).
        run_dir: The run folder (``metrics.jsonl`` and every file-based backend go there).
        logger: The trainer's logger (the console writer writes through it).
        sources: Objects that may bring a writer (:class:`WriterSource`: the progress bar hook);
            the others are skipped. Their writers come after the configured ones.

    Raises:
        KeyError: an unknown writer name (the closest known name is suggested).
        TypeError: ``spec`` is not a list, an item is neither a name, a dict nor a Writer, or a
            dict holds an argument the writer does not take (its arguments are named).
        ImportError: the backend's package is not installed (the message names the extra to install).
    """
    if spec is None:
        spec = DEFAULT_WRITERS
    elif isinstance(spec, (str, Writer, Mapping)) or not isinstance(spec, Sequence):
        raise TypeError(
            f"writers must be a list of Writer objects, names {sorted(WRITERS)} and dicts with 'type', got "
            f"{type(spec).__name__}: e.g. writers=['console', 'jsonl', MyWriter()]"
        )
    out: list[Writer] = []
    for item in spec:
        if isinstance(item, Writer):
            out.append(item)
        elif isinstance(item, (str, Mapping)):
            out.append(_build_named(item, run_dir, logger))
        else:
            raise TypeError(
                f"writers items must be writer names {sorted(WRITERS)}, dicts with 'type' or Writer objects, got "
                f"{type(item).__name__}: "
                "subclass trainwright.logging.Writer and override write_train / write_eval / write_config / flush / "
                "close as needed"
            )
    for source in sources:
        if isinstance(source, WriterSource):
            w = source.records_writer(logger)
            if w is not None:
                out.append(w)
    return out


def _build_named(item: str | Mapping[str, Any], run_dir: Path, logger: logging.Logger) -> Writer:
    kwargs = dict(item) if isinstance(item, Mapping) else {"type": item}
    name = kwargs.pop("type", None)
    if not isinstance(name, str):
        raise TypeError(
            f"A writer dict needs a 'type' naming one of {sorted(WRITERS)}, got {item!r}: e.g. dict(type='tensorboard')"
        )
    factory = WRITERS.get(name)
    if factory is None:
        raise KeyError(
            f"Unknown writer {name!r}.{did_you_mean(name, sorted(WRITERS))} Known writers: {sorted(WRITERS)}; or pass "
            "a Writer object"
        )
    return factory(run_dir, logger, **kwargs)


def plain(obj: Any) -> Any:
    """``obj`` as JSON-like data (dicts, lists, strings, numbers, None); anything else as its ``repr``.

    For :meth:`Writer.write_config`: the trainer's arguments may hold objects (a DataLoader, a model).
    """
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)
