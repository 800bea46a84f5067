"""Checkpoint files on disk: atomic writes and safe loads.

* **Complete or absent.** Written under a hidden temporary name, fsynced, renamed onto the target, directory
  fsynced: a killed process leaves the previous file or the new one (``durable=False``: the fsyncs run in a
  background thread, :mod:`trainwright.checkpoint.durability`).
* **Loading never runs code.** ``torch.load(..., weights_only=True)``; a pickle that would
  import or call objects raises :class:`UnsafeCheckpointError`. An mmengine checkpoint (its
  ``HistoryBuffer`` s, numpy values) is read by an allowlist of inert stand-ins as plain data
  (:mod:`trainwright.checkpoint.mmengine_ckpt`).
"""

from __future__ import annotations

import os
import pickle
import pickletools
import secrets
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Union

import torch

from trainwright.checkpoint.durability import fsync_dir, fsync_later
from trainwright.checkpoint.storage import RemotePath, location

PathLike = Union[str, "os.PathLike[str]"]  # noqa: UP007 (a string forward reference: `|` would be evaluated at import)
MapLocation = str | torch.device | Callable[..., Any] | dict[str, str] | None

CHECKPOINT_SUFFIX = ".pth"
#: Part of the name of every temporary file of a write in progress (``.<name>.tmp.<pid>.<hex>``).
TMP_MARKER = ".tmp."
# Substrings of torch's weights-only unpickler messages that mean "this pickle wants to
# import or call something that is not allowlisted" (a refusal), as opposed to a broken file.
_REFUSAL_MARKERS = (
    "GLOBAL",
    "allowlist",
    "Trying to call reduce",
    "is blocked",
    "must be imported",
)
_FIX_BROKEN = (
    "The file is truncated or corrupt (e.g. the disk filled up or it was copied partially). "
    "Resume from the previous checkpoint (delete or move this file, or point `resume=` at an "
    "older one), or copy the file again from its source."
)
_FIX_UNSAFE = (
    "It was refused for safety: the safe loader (torch.load(weights_only=True)) cannot read it "
    "without unpickling arbitrary Python objects, which can run code. If you trust the file, convert it yourself: "
    "`obj = torch.load(path, weights_only=False)`, keep only tensors and plain containers "
    "(dict/list/tuple/str/int/float/bool/None), and save that with `torch.save` (or "
    "`trainwright.checkpoint.atomic_save`)."
)


class CheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be read: truncated, corrupt or not a checkpoint."""


class UnsafeCheckpointError(CheckpointError):
    """``torch.load(weights_only=True)`` refused a file because it pickles arbitrary objects."""


# --------------------------------------------------------------------------- writing


def _temp_path(target: Path) -> Path:
    return target.with_name(f".{target.name}{TMP_MARKER}{os.getpid()}.{secrets.token_hex(4)}")


def atomic_write(path: PathLike, write: Callable[[IO[bytes]], object], *, durable: bool = True) -> None:
    """Write a file so that ``path`` is always either its old content or the new one.

    ``write`` receives a binary file object opened on a temporary file in the target's
    directory; after it returns, the data is flushed, fsynced and renamed onto ``path``, and
    the directory is fsynced. Parent directories are created. If anything raises, the
    temporary file is removed, ``path`` is untouched and the exception propagates: the real
    cause, not the wrapper a writer put around it (``torch.save`` reports a full disk or a
    Ctrl-C inside its writer as
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``). A
    ``KeyboardInterrupt`` stays one; an ``OSError`` is re-raised with ``path`` as its
    ``filename`` and a message that says nothing was replaced and what to do.

    With ``durable=False`` the call returns once the complete file is renamed into place: it
    is whole for every process and survives a ``kill -9`` (the OS's page cache holds it), and
    the two fsyncs that make it survive a power loss run in a background thread
    (:mod:`trainwright.checkpoint.durability`): its ``wait_durable`` waits for them and
    raises a failure, its ``when_durable`` runs work (deleting older checkpoints) only after them.
    On Windows, which cannot rename a file that is still open, the fsyncs run here.

    Args:
        path: The target file.
        write: Callable that writes the whole content into the file object it is given.
        durable: fsync before returning (True) or in the background (False).

    Raises:
        OSError: writing failed (disk full, permissions); ``errno`` is the OS's, ``filename`` is ``path``.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _write_error(e, target) from e
    tmp = _temp_path(target)
    later = not durable and os.name != "nt"
    fd = -1  # with `later`: a descriptor of the file for the background fsync, open across the rename
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            if later:
                fd = os.dup(f.fileno())
            else:
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        if fd >= 0:
            os.close(fd)
        try:
            tmp.unlink()
        except OSError:
            pass
        cause = _real_cause(e)
        if isinstance(cause, KeyboardInterrupt):
            raise cause from None
        if isinstance(cause, OSError):
            raise _write_error(cause, target) from e
        raise
    if later:
        fsync_later(fd, target)
    else:
        fsync_dir(target.parent)


def _real_cause(e: BaseException) -> BaseException:
    """The OSError / KeyboardInterrupt that a writer (torch's zip writer) reported as another error, else ``e``."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, (OSError, KeyboardInterrupt)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return e


def _write_error(e: OSError, target: Path) -> OSError:
    reason = e.strerror or str(e)
    return OSError(
        e.errno,
        f"{reason} while writing {target}: nothing was replaced, the previous checkpoint and `latest` are as they "
        "were. "
        "Make free space on that disk (e.g. CheckpointHook max_keep_ckpts=k) or fix its permissions, or write "
        "elsewhere "
        "(CheckpointHook out_dir=); then continue with resume=True",
        str(target),
    )


def atomic_save(obj: Mapping[str, Any], path: PathLike, *, durable: bool = True) -> None:
    """``torch.save`` ``obj`` to ``path`` atomically: the file is complete or absent.

    Args:
        obj: The checkpoint dict. Keep it to tensors and plain containers so that it
            loads with ``weights_only=True`` (see :func:`load_file`).
        path: The target file; its parent directories are created.
        durable: False: fsync in the background (see :func:`atomic_write`).
    """
    atomic_write(path, lambda f: torch.save(obj, f), durable=durable)


def atomic_write_bytes(path: PathLike, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_write`)."""
    atomic_write(path, lambda f: f.write(data), durable=durable)


def write_whole(path: PathLike | RemotePath, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` as ``path``, complete or absent: atomically on local disk (:func:`atomic_write`; ``durable`` as
    there), as one object in a store."""
    loc = location(path)
    if isinstance(loc, RemotePath):
        loc.write_bytes(data)
    else:
        atomic_write_bytes(loc, data, durable=durable)


def atomic_write_text(path: PathLike, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically (see :func:`atomic_write`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


# --------------------------------------------------------------------------- loading


def _is_refusal(message: str) -> bool:
    return "Weights only load failed" in message and any(m in message for m in _REFUSAL_MARKERS)


def first_reason(message: str) -> str:
    """The most telling line of torch's (long) error message, for our own shorter one."""
    lines = [ln.strip().replace("\033[1m", "").replace("\033[0m", "") for ln in message.splitlines()]
    lines = [ln for ln in lines if ln]
    for ln in lines:
        if any(m in ln for m in _REFUSAL_MARKERS) or "Unsupported" in ln:
            ln = ln.removeprefix("WeightsUnpickler error:").strip()
            return ln.split(" Please use `torch.serialization")[0]
    return lines[0] if lines else message


def read_safetensors(path: PathLike, map_location: MapLocation = "cpu") -> dict[str, torch.Tensor]:
    """Read a safetensors file into a dict of tensors (on ``map_location`` if it names a device).

    Raises:
        FileNotFoundError: ``path`` does not exist (the message names it).
        CheckpointError: the file is truncated or corrupt.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file as st_load_file

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"Safetensors file {str(p)!r} does not exist. Check the path.")
    device = str(map_location) if isinstance(map_location, (str, torch.device)) else "cpu"
    try:
        return st_load_file(p, device=device)
    except (SafetensorError, OSError, ValueError) as e:
        raise _broken(p, f"not a valid safetensors file ({e})") from e


def load_file(path: PathLike | RemotePath, map_location: MapLocation = "cpu") -> dict[str, Any]:
    """Load a checkpoint file without executing any code from it.

    ``.safetensors`` files are read with safetensors (a dict of tensors); anything else
    with ``torch.load(path, map_location=..., weights_only=True)``. ``path`` may be an fsspec
    URL or a store's path (:mod:`trainwright.checkpoint.storage`); writing one is
    :func:`~trainwright.checkpoint.remote_io.save_remote` (one object published). What a
    folder holds (``latest``, the resume candidates): :mod:`trainwright.checkpoint.listing`.

    Args:
        path: The checkpoint file or URL.
        map_location: Where tensors go, as for ``torch.load`` (default: CPU, so that a
            checkpoint saved on a GPU loads on a machine without one).

    Returns:
        The loaded object (a dict for every checkpoint trainwright writes).

    Raises:
        FileNotFoundError: ``path`` does not exist (the message names it).
        UnsafeCheckpointError: the file would need to unpickle arbitrary objects.
        CheckpointError: the file is truncated, corrupt or not a checkpoint.
    """
    loc = location(path)
    if isinstance(loc, RemotePath):
        return _load_remote(loc, map_location)
    return load_local(loc, map_location)


def _load_remote(src: RemotePath, map_location: MapLocation) -> dict[str, Any]:
    """Fetch ``src`` from its store into a temporary file and load that; messages name the store's path."""
    import tempfile

    if not src.is_file():
        raise FileNotFoundError(
            f"Checkpoint {src.url!r} does not exist"
            + (" (it is a folder)" if src.is_dir() else "")
            + ". Check the URL, or pass resume=True to pick the newest checkpoint of a folder."
        )
    with tempfile.TemporaryDirectory(prefix="trainwright-download-") as d:
        local = Path(d) / src.name
        src.download(local)
        return load_local(local, map_location, shown=src.url)


def load_local(p: Path, map_location: MapLocation, shown: str | None = None) -> dict[str, Any]:
    """:func:`load_file` of a local file; ``shown`` is the name messages give it (a URL it was downloaded from)."""
    if shown is not None:
        try:
            return load_local(p, map_location)
        except (CheckpointError, FileNotFoundError) as e:
            raise type(e)(str(e).replace(repr(str(p)), repr(shown)).replace(str(p), shown)) from e
    if not p.is_file():
        raise FileNotFoundError(
            f"Checkpoint file {str(p)!r} does not exist"
            + (" (it is a directory)" if p.is_dir() else "")
            + ". Check the path, or pass resume=True to pick the newest checkpoint in a directory."
        )
    if p.suffix == ".safetensors":
        return read_safetensors(p, map_location)
    try:
        return torch.load(p, map_location=map_location, weights_only=True)  # type: ignore[no-any-return]
    except pickle.UnpicklingError as e:
        msg = str(e)
        if "Weights only load failed" not in msg:
            raise _broken(p, first_reason(msg)) from e
        if zipfile.is_zipfile(p):
            # A torch.save archive: a damaged pickle can read like a forbidden global, so
            # trust the refusal only when every member passes its CRC check.
            damage = _archive_damage(p)
            if damage is not None or not _is_refusal(msg):
                raise _broken(p, damage or first_reason(msg)) from None
        elif not _is_refusal(msg) and not _is_pickle(p):
            # Bytes that are no pickle at all (an HTML error page, random data) are corrupt, never "unsafe".
            raise _broken(p, "not a checkpoint: neither a torch.save zip archive nor a pickle") from None
        from trainwright.checkpoint.mmengine_ckpt import (
            is_foreign_refusal,
            read_mmengine_checkpoint,
        )  # it imports this module

        if is_foreign_refusal(
            msg
        ):  # mmengine's HistoryBuffer / numpy: read as plain data by an allowlist, still running no code
            return read_mmengine_checkpoint(p, map_location)
        # A plain (non-zip) pickle that asks for globals was not written by torch.save;
        # whatever it holds can only be read unsafely.
        reason = first_reason(msg).rstrip(".")
        raise UnsafeCheckpointError(f"Refused to load checkpoint {str(p)!r}: {reason}. {_FIX_UNSAFE}") from None
    except EOFError as e:
        raise _broken(p, "unexpected end of file") from e
    except (RuntimeError, ValueError, OSError, KeyError, IndexError, AssertionError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        # Errors that are not about the bytes (e.g. map_location naming a missing device)
        # propagate unchanged; the file is blamed only when it fails an integrity check.
        damage = _archive_damage(p) if zipfile.is_zipfile(p) else "not a torch.save zip archive"
        if damage is None and "PytorchStreamReader" not in str(e):
            raise
        raise _broken(p, damage or first_reason(str(e))) from e


def _is_pickle(p: Path) -> bool:
    """True if ``p`` starts with a well-formed pickle (parsed with :mod:`pickletools`: nothing is executed)."""
    try:
        with open(p, "rb") as f:
            for _ in pickletools.genops(f):
                pass
    except Exception:  # noqa: BLE001 - any parse failure means "not a pickle"
        return False
    return True


def _broken(p: Path, reason: str) -> CheckpointError:
    return CheckpointError(f"Cannot read checkpoint {str(p)!r}: {reason.rstrip('.')}. {_FIX_BROKEN}")


def _archive_damage(p: Path) -> str | None:
    """Describe what is wrong with the zip archive ``p`` (bad CRC, bad structure), or ``None``."""
    try:
        with zipfile.ZipFile(p) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError) as e:  # zlib/CRC/struct errors
        return f"damaged zip archive ({e})"
    return None if bad is None else f"archive member {bad!r} fails its CRC check"
