"""Where checkpoints live: a local folder (:class:`~pathlib.Path`) or a path of a :class:`Store` (:class:`RemotePath`).

:func:`location` decides once per path: a local path stays a ``Path``; a URL becomes a :class:`RemotePath` on a new
:class:`FsspecStore`; a :class:`Store` (e.g. a :class:`LocalStore`, or one written by a user) is its root. A path
carries its store: nothing is registered per process.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol, TypeVar, Union, runtime_checkable

_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://")
#: ``pip install`` extra per URL scheme (anything else: the ``fsspec`` extra plus that scheme's fsspec backend).
_EXTRAS = {"s3": "s3", "s3a": "s3"}
_T = TypeVar("_T")


@runtime_checkable
class Store(Protocol):
    """Where a run's checkpoints (and copies of its logs) are published: what the checkpoint code asks of a storage.

    Paths are strings under :attr:`url` joined by ``/``. An object is published whole: a reader sees
    the old content or the new one. :class:`FsspecStore` (object storage) and :class:`LocalStore` (a
    folder) implement it; a store of your own passed as ``out_dir`` (``Trainer(checkpoint=dict(out_dir=store))``)
    is used the same way. ``fallback_dir`` is where a checkpoint that could not be published is kept
    (the checkpoint manager sets it: ``work_dir/checkpoints_unuploaded``).
    """

    url: str
    fallback_dir: Path | None
    checked: bool

    def info(self, url: str) -> Mapping[str, Any] | None:
        """``{"type": "file" | "directory", "size": int, "mtime": float}`` of ``url``; None when it does not exist."""
        ...

    def list(self, url: str) -> list[Mapping[str, Any]]:
        """The entries of the folder ``url`` (each as :meth:`info` plus its full ``"name"``); [] for a missing one."""
        ...

    def read(self, url: str) -> bytes:
        """The content of the object ``url`` (FileNotFoundError when missing)."""
        ...

    def write(self, url: str, data: bytes) -> None:
        """Publish ``data`` as the object ``url`` (complete or absent)."""
        ...

    def publish(self, local: Path, url: str) -> None:
        """Publish the local file ``local`` as the object ``url`` (complete or absent)."""
        ...

    def fetch(self, url: str, local: Path) -> None:
        """Copy the object ``url`` into the local file ``local``."""
        ...

    def remove(self, url: str) -> None:
        """Delete the object or folder ``url`` with everything under it; a missing one is fine."""
        ...

    def check(self, purpose: str = "checkpoints") -> None:
        """Raise an OSError naming the store, what is wrong and the fix when it cannot be written; sets ``checked``."""
        ...

    def explain(self, e: BaseException) -> str:
        """What an error of this store means and how to fix it."""
        ...


def is_url(path: object) -> bool:
    """True for a URL that is not a local path: ``s3://...``, ``memory://...`` (a ``file://`` URL is local)."""
    if not isinstance(path, str):
        return isinstance(path, (RemotePath, Store))
    m = _SCHEME.match(path)
    return m is not None and m["scheme"].lower() != "file"


def location(
    path: str | os.PathLike[str] | RemotePath | Store, storage_options: Mapping[str, Any] | None = None, *, within: Location | None = None,
) -> Path | RemotePath:
    """``path`` as a :class:`RemotePath` (a URL, a :class:`Store`) or a ``Path`` (a local path, or a ``file://`` URL).

    A URL under ``within`` (the checkpoint folder of a trainer, a :class:`RemotePath`) is a path of
    that folder's store, so it keeps that store's ``storage_options``; otherwise a new
    :class:`FsspecStore` reads its credentials and endpoint from ``storage_options`` or the environment
    (s3fs: ``AWS_ACCESS_KEY_ID`` ..., ``AWS_ENDPOINT_URL``). Nothing is shared between calls.

    Raises:
        ImportError: the URL's fsspec backend is not installed (names the extra to install).
    """
    if isinstance(path, RemotePath):
        return path
    if isinstance(path, Store):
        return RemotePath(path, path.url)
    if isinstance(path, str):
        m = _SCHEME.match(path)
        if m is not None:
            if m["scheme"].lower() == "file":
                return Path(path[len(m[0]):])
            url = path.rstrip("/")
            if storage_options is None and isinstance(within, RemotePath):
                root = within.store.url
                if url == root or url.startswith(root + "/"):
                    return RemotePath(within.store, url)
            return FsspecStore(url, storage_options).root
    return Path(path)


def remove(path: str | os.PathLike[str] | RemotePath) -> None:
    """Delete a checkpoint: a file, or a folder with everything under it (a sharded checkpoint), local or in its store; a missing one is fine."""
    loc = location(path)
    if isinstance(loc, RemotePath):
        loc.remove()
    elif loc.is_dir():
        import shutil

        shutil.rmtree(loc, ignore_errors=True)
    else:
        loc.unlink(missing_ok=True)


def local_path(path: str | os.PathLike[str] | RemotePath, who: str = "this strategy") -> Path:
    """``path`` as a local ``Path``; a store's path (a URL) is a ValueError naming ``who`` and the fix."""
    loc = location(path)
    if isinstance(loc, RemotePath):
        raise ValueError(f"{loc}: {who} reads and writes checkpoints on local disk only. Give a local folder as the checkpoint out_dir "
                         "(and copy it to object storage yourself), or use strategy='fsdp' / 'ddp'")
    return loc


def fsspec_store(path: RemotePath, who: str = "strategy='fsdp'") -> FsspecStore:
    """The :class:`FsspecStore` of ``path``; a store of another kind is a ValueError (sharded checkpoints go through DCP's fsspec writer)."""
    if not isinstance(path.store, FsspecStore):
        raise ValueError(f"{path}: {who} writes sharded checkpoints through DCP's fsspec writer, which needs an fsspec URL (s3://, memory://...) "
                         f"as out_dir, not a {type(path.store).__name__}. Give an fsspec URL or a local folder")
    return path.store


def _filesystem(url: str, protocol: str, options: Mapping[str, Any]) -> Any:
    extra = _EXTRAS.get(protocol, "fsspec")
    try:
        import fsspec
    except ImportError as e:
        raise ImportError(f"{url}: checkpoints and logs on an fsspec URL need fsspec, which is not installed. pip install 'trainwright[{extra}]'") from e
    try:
        return fsspec.filesystem(protocol, **dict(options))
    except ImportError as e:
        raise ImportError(
            f"{url}: the fsspec backend of {protocol}:// is not installed ({e}). "
            + (f"pip install 'trainwright[{extra}]'" if protocol in _EXTRAS else "Install that backend (see fsspec's list of known implementations)")
        ) from e
    except ValueError as e:
        raise ValueError(f"{url}: fsspec does not know the protocol {protocol!r} ({e}). Check the URL, or install that protocol's fsspec backend") from e


def _within(fn: Callable[[], _T], seconds: float | None) -> _T:
    """``fn()``, or a TimeoutError after ``seconds`` (the call goes on in a daemon thread and its result is dropped)."""
    if seconds is None:
        return fn()
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="trainwright-remote-io", daemon=True).start()
    if not done.wait(seconds):
        raise TimeoutError(f"no answer within {seconds:.0f} s (a stalled connection or server; storage_options attempt_timeout_s sets the limit)")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class FsspecStore:
    """A :class:`Store` on an fsspec filesystem for one URL root; writes are retried, each within a deadline.

    Args:
        url: The root, e.g. ``s3://bucket/run/checkpoints``.
        storage_options: fsspec options (s3fs: ``key``, ``secret``, ``client_kwargs=dict(endpoint_url=...)``).
            ``attempt_timeout_s`` is trainwright's own key (not passed to fsspec): see below.
        tries: Attempts per upload (one write or one delete) before giving up.
        backoff_s: Sleep before the second attempt, doubled for each further one.
        attempt_timeout_s: How long one attempt may take before it counts as failed, plus one
            second per 5 MB written (a stalled connection: s3fs's uploads have no deadline of
            their own). None: no deadline. Default 120 s, or ``storage_options["attempt_timeout_s"]``.
    """

    #: Bytes per second the deadline of an attempt allows for on top of ``attempt_timeout_s``.
    MIN_RATE = 5 * 2**20

    def __init__(
        self, url: str, storage_options: Mapping[str, Any] | None = None, *, tries: int = 3, backoff_s: float = 0.5, attempt_timeout_s: float | None = 120.0,
    ) -> None:
        m = _SCHEME.match(url)
        if m is None:
            raise ValueError(f"{url!r} is not a URL (scheme://...)")
        self.url = url.rstrip("/")
        self.protocol = m["scheme"].lower()
        self.options: dict[str, Any] = dict(storage_options or {})
        self.attempt_timeout_s: float | None = self.options.pop("attempt_timeout_s", attempt_timeout_s)
        self.fs = _filesystem(url, self.protocol, self.options)
        self.tries, self.backoff_s = max(1, tries), backoff_s
        #: Where a checkpoint whose upload keeps failing is written instead (set by the checkpoint manager: ``work_dir/checkpoints_unuploaded``).
        self.fallback_dir: Path | None = None
        #: True once :meth:`check` passed.
        self.checked = False

    @property
    def root(self) -> RemotePath:
        """The store's root URL as a path."""
        return RemotePath(self, self.url)

    def local_fallback(self) -> Path:
        """The local folder a checkpoint whose upload keeps failing is kept in: :attr:`fallback_dir`, else ``./checkpoints_unuploaded``."""
        return self.fallback_dir or Path.cwd() / "checkpoints_unuploaded"

    # -- the Store protocol ---------------------------------------------------------------
    def info(self, url: str) -> Mapping[str, Any] | None:  # noqa: D102
        try:
            info: Mapping[str, Any] = self.fs.info(url)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except Exception as e:  # noqa: BLE001 - credentials, endpoint: say which URL and what to check
            raise OSError(
                f"Cannot read {url}: {self.explain(e)}. A URL outside the CheckpointHook's out_dir does not get its "
                "storage_options: give credentials and the endpoint in the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL...)"
            ) from e
        return info

    def list(self, url: str) -> list[Mapping[str, Any]]:  # noqa: D102
        self.fs.invalidate_cache(url)
        try:
            entries = self.fs.ls(url, detail=True)
        except FileNotFoundError:
            return []
        base = url.split("://", 1)[0] + "://"
        out: list[Mapping[str, Any]] = []
        for info in entries:
            name = str(info["name"]).rstrip("/")
            full = f"{url}/{name.rsplit('/', 1)[-1]}" if "/" in name else base + name
            if full != url:
                out.append({**info, "name": full})
        return out

    def read(self, url: str) -> bytes:  # noqa: D102
        return self.fs.cat_file(url)  # type: ignore[no-any-return]

    def write(self, url: str, data: bytes) -> None:
        """One PUT (visible only when complete on S3/GCS/Azure), retried."""
        self.retry(f"Writing {url}", lambda: self.fs.pipe_file(url, data), len(data))

    def publish(self, local: Path, url: str) -> None:
        """Upload ``local`` as one object, retried."""
        self.retry(f"Uploading {url}", lambda: self.fs.put_file(str(local), url), local.stat().st_size)

    def fetch(self, url: str, local: Path) -> None:  # noqa: D102
        self.fs.get_file(url, str(local))

    def remove(self, url: str) -> None:  # noqa: D102
        def rm() -> None:
            try:
                self.fs.rm(url, recursive=True)
            except FileNotFoundError:
                pass

        self.retry(f"Deleting {url}", rm)
        self.fs.invalidate_cache(url.rsplit("/", 1)[0])

    def retry(self, what: str, fn: Callable[[], _T], size: int = 0) -> _T:
        """``fn()``, tried ``tries`` times with a short backoff, each attempt within its deadline (``size``: bytes written); the last error propagates."""
        deadline = None if self.attempt_timeout_s is None else self.attempt_timeout_s + size / self.MIN_RATE
        for attempt in range(self.tries):
            try:
                return _within(fn, deadline)
            except Exception as e:  # noqa: BLE001 - network and service errors come in many types
                if attempt + 1 == self.tries:
                    raise
                warnings.warn(f"{what} failed ({type(e).__name__}: {e}); trying again ({attempt + 2} of {self.tries})", stacklevel=3)
                time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def check(self, purpose: str = "checkpoints") -> None:
        """Write and delete a small probe object under the root: the bucket exists, the credentials may write, the endpoint answers.

        Raises:
            OSError: naming the URL, what is wrong and the fix.
        """
        probe = f"{self.url}/.trainwright-write-check-{secrets.token_hex(4)}"
        try:
            _within(lambda: (self.fs.pipe_file(probe, b"ok"), self.fs.rm_file(probe)), self.attempt_timeout_s)
        except Exception as e:  # noqa: BLE001 - classified below
            raise OSError(f"Cannot write to {self.url} ({purpose}): {self.explain(e)}. Nothing was trained or written.") from e
        self.checked = True

    def explain(self, e: BaseException) -> str:
        """What an error of this store means and how to fix it (bucket, credentials, endpoint)."""
        text = f"{type(e).__name__}: {e}"
        low = text.lower()
        endpoint = (self.options.get("client_kwargs") or {}).get("endpoint_url") or self.options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL")
        if isinstance(e, FileNotFoundError) or "nosuchbucket" in low or "bucket does not exist" in low:
            return f"the bucket does not exist ({text}). Create it (e.g. `aws s3 mb {self.url.split('/')[0]}//{self.url.split('/')[2]}`) or fix the URL"
        if isinstance(e, PermissionError) or any(s in low for s in ("accessdenied", "access denied", "invalidaccesskeyid", "signaturedoesnotmatch", "forbidden", "credentials")):
            return (f"access denied ({text}). Check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE in the environment, "
                    "or storage_options=dict(key=..., secret=...)) and that they may write to this bucket")
        if any(s in low for s in ("connect", "endpoint", "timeout", "timed out", "unreachable", "name resolution")):
            return (f"cannot reach the storage endpoint{f' {endpoint}' if endpoint else ''} ({text}). Check the endpoint "
                    "(storage_options=dict(client_kwargs=dict(endpoint_url=...)) or AWS_ENDPOINT_URL) and the network")
        return f"{text}. Check the URL, the credentials and the endpoint (storage_options= or the AWS_* environment variables)"


class RemotePath:
    """A file or folder of a :class:`Store`, addressed by its path string (a URL); the ``pathlib`` subset the checkpoint code needs.

    It offers the few ``pathlib`` operations the checkpoint code uses (``/``, ``name``,
    ``parent``, ``exists``, ``iterdir``...). ``str()`` is the URL. It has no ``__fspath__``:
    local file functions refuse it, so nothing opens it as a local file by accident (a local
    folder named ``s3:``).
    """

    __slots__ = ("store", "url", "_info")

    def __init__(self, store: Store, url: str, info: Mapping[str, Any] | None = None) -> None:
        self.store = store
        self.url = url.rstrip("/")
        self._info = info

    # -- names --------------------------------------------------------------------------
    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(self.store, f"{self.url}/{str(name).strip('/')}")

    @property
    def name(self) -> str:  # noqa: D102
        return self.url.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:  # noqa: D102
        return Path(self.name).suffix

    @property
    def stem(self) -> str:  # noqa: D102
        return Path(self.name).stem

    @property
    def parent(self) -> RemotePath:  # noqa: D102
        return RemotePath(self.store, self.url.rsplit("/", 1)[0])

    def with_name(self, name: str) -> RemotePath:  # noqa: D102
        return self.parent / name

    def is_absolute(self) -> bool:  # noqa: D102
        return True

    # -- queries ------------------------------------------------------------------------
    def _details(self) -> Mapping[str, Any] | None:
        if self._info is None:
            self._info = self.store.info(self.url)
        return self._info

    def exists(self) -> bool:  # noqa: D102
        return self._details() is not None

    def is_file(self) -> bool:  # noqa: D102
        info = self._details()
        return info is not None and info.get("type") == "file"

    def is_dir(self) -> bool:  # noqa: D102
        info = self._details()
        return info is not None and info.get("type") == "directory"

    def stat(self) -> SimpleNamespace:
        """``st_mtime_ns`` (0 where the store keeps none, e.g. an S3 prefix) and ``st_size``."""
        info = self._details() or {}
        mtime = info.get("LastModified") or info.get("mtime") or info.get("created") or info.get("updated")
        stamp = float(mtime.timestamp()) if mtime is not None and hasattr(mtime, "timestamp") else float(mtime or 0)
        return SimpleNamespace(st_mtime_ns=int(stamp * 1e9), st_size=int(info.get("size") or 0))

    def iterdir(self) -> Iterator[RemotePath]:
        """The entries of this folder (with their details, so queries on them cost no request); fresh from the store."""
        return iter([RemotePath(self.store, str(info["name"]), info) for info in self.store.list(self.url)])

    # -- content ------------------------------------------------------------------------
    def read_bytes(self) -> bytes:  # noqa: D102
        return self.store.read(self.url)

    def read_text(self, encoding: str = "utf-8") -> str:  # noqa: D102
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        """Publish ``data`` as this object (complete or absent)."""
        self.store.write(self.url, data)
        self._info = None

    def write_text(self, text: str, encoding: str = "utf-8") -> None:  # noqa: D102
        self.write_bytes(text.encode(encoding))

    def upload(self, local: Path) -> None:
        """Publish the local file ``local`` as this path (one object, complete or absent)."""
        self.store.publish(local, self.url)
        self._info = None

    def download(self, local: Path) -> None:
        """Copy this object into the local file ``local``."""
        self.store.fetch(self.url, local)

    def remove(self) -> None:
        """Delete this object, or this folder with everything under it; a missing one is fine."""
        self.store.remove(self.url)
        self._info = None


class LocalStore:
    """A :class:`Store` on a local folder: files written under a temporary name and renamed, so each is complete or absent.

    Paths are the folder's own (``str(path)`` is a local path). A checkpoint folder given as a plain path
    stays a ``Path`` (the local code, with the folder's lock); a ``LocalStore`` is for a store with the remote
    behaviour (publish, keep a copy in ``fallback_dir`` on failure), e.g. a mounted share, or a subclass in a test.

    Args:
        root: The folder (created on the first write).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.url = str(Path(root).absolute()).rstrip("/")
        self.fallback_dir: Path | None = None
        self.checked = False

    @property
    def root(self) -> RemotePath:
        """The store's root as a path."""
        return RemotePath(self, self.url)

    def info(self, url: str) -> Mapping[str, Any] | None:  # noqa: D102
        try:
            st = os.stat(url)
        except (FileNotFoundError, NotADirectoryError):
            return None
        kind = "directory" if Path(url).is_dir() else "file"
        return {"name": url, "type": kind, "size": st.st_size, "mtime": st.st_mtime}

    def list(self, url: str) -> list[Mapping[str, Any]]:  # noqa: D102
        if not Path(url).is_dir():
            return []
        return [info for p in sorted(Path(url).iterdir()) if (info := self.info(str(p))) is not None]

    def read(self, url: str) -> bytes:  # noqa: D102
        return Path(url).read_bytes()

    def write(self, url: str, data: bytes) -> None:  # noqa: D102
        target = Path(url)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def publish(self, local: Path, url: str) -> None:  # noqa: D102
        self.write(url, Path(local).read_bytes())

    def fetch(self, url: str, local: Path) -> None:  # noqa: D102
        import shutil

        shutil.copyfile(url, local)

    def remove(self, url: str) -> None:  # noqa: D102
        import shutil

        p = Path(url)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)

    def check(self, purpose: str = "checkpoints") -> None:
        """Create the folder and write and delete a probe file in it.

        Raises:
            OSError: naming the folder, what is wrong and the fix.
        """
        probe = Path(self.url) / f".trainwright-write-check-{secrets.token_hex(4)}"
        try:
            probe.parent.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as e:
            raise OSError(f"Cannot write to {self.url} ({purpose}): {self.explain(e)}. Nothing was trained or written.") from e
        self.checked = True

    def explain(self, e: BaseException) -> str:  # noqa: D102
        return f"{type(e).__name__}: {e}. Check that the folder exists, is writable and has free space"


#: The former name of :class:`FsspecStore` (kept for code that names it).
RemoteStore = FsspecStore


Location = Union[Path, RemotePath]
"""Where a checkpoint (file or folder) lives."""
