""":class:`FsspecStore`: a :class:`~trainwright.checkpoint.store.Store` on an fsspec URL (``s3://``, ``gs://``,
``memory://``...).

One object is written by one PUT, which S3, GCS and Azure make visible only when complete; every
write is retried, each attempt within a deadline (a stalled connection fails instead of hanging).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from trainwright.checkpoint.store import URL_SCHEME, RemotePath

#: ``pip install`` extra per URL scheme (anything else: the ``fsspec`` extra plus that scheme's fsspec backend).
_EXTRAS = {"s3": "s3", "s3a": "s3"}
_T = TypeVar("_T")


def _filesystem(url: str, protocol: str, options: Mapping[str, Any]) -> Any:
    extra = _EXTRAS.get(protocol, "fsspec")
    try:
        import fsspec
    except ImportError as e:
        raise ImportError(
            f"{url}: checkpoints and logs on an fsspec URL need fsspec, which is not installed. pip install "
            f"'trainwright[{extra}]'"
        ) from e
    try:
        return fsspec.filesystem(protocol, **dict(options))
    except ImportError as e:
        raise ImportError(
            f"{url}: the fsspec backend of {protocol}:// is not installed ({e}). "
            + (
                f"pip install 'trainwright[{extra}]'"
                if protocol in _EXTRAS
                else "Install that backend (see fsspec's list of known implementations)"
            )
        ) from e
    except ValueError as e:
        raise ValueError(
            f"{url}: fsspec does not know the protocol {protocol!r} ({e}). Check the URL, or install that protocol's "
            "fsspec backend"
        ) from e


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
        raise TimeoutError(
            f"no answer within {seconds:.0f} s (a stalled connection or server; storage_options attempt_timeout_s sets "
            "the limit)"
        )
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
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        tries: int = 3,
        backoff_s: float = 0.5,
        attempt_timeout_s: float | None = 120.0,
    ) -> None:
        m = URL_SCHEME.match(url)
        if m is None:
            raise ValueError(f"{url!r} is not a URL (scheme://...)")
        self.url = url.rstrip("/")
        self.protocol = m["scheme"].lower()
        self.options: dict[str, Any] = dict(storage_options or {})
        self.attempt_timeout_s: float | None = self.options.pop("attempt_timeout_s", attempt_timeout_s)
        self.fs = _filesystem(url, self.protocol, self.options)
        self.tries, self.backoff_s = max(1, tries), backoff_s
        #: Where a checkpoint whose upload keeps failing is written instead (set by the checkpoint manager:
        #: ``work_dir/checkpoints_unuploaded``).
        self.fallback_dir: Path | None = None
        #: True once :meth:`check` passed.
        self.checked = False

    @property
    def root(self) -> RemotePath:
        """The store's root URL as a path."""
        return RemotePath(self, self.url)

    def local_fallback(self) -> Path:
        """The local folder a checkpoint whose upload keeps failing is kept in: :attr:`fallback_dir`, else
        ``./checkpoints_unuploaded``."""
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
                "storage_options: give credentials and the endpoint in the environment (AWS_ACCESS_KEY_ID, "
                "AWS_ENDPOINT_URL...)"
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
        """``fn()``, tried ``tries`` times with a short backoff, each attempt within its deadline (``size``: bytes
        written); the last error propagates."""
        deadline = None if self.attempt_timeout_s is None else self.attempt_timeout_s + size / self.MIN_RATE
        for attempt in range(self.tries):
            try:
                return _within(fn, deadline)
            except Exception as e:  # noqa: BLE001 - network and service errors come in many types
                if attempt + 1 == self.tries:
                    raise
                warnings.warn(
                    f"{what} failed ({type(e).__name__}: {e}); trying again ({attempt + 2} of {self.tries})",
                    stacklevel=3,
                )
                time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def check(self, purpose: str = "checkpoints") -> None:
        """Write and delete a small probe object under the root: the bucket exists, the credentials may write, the
        endpoint answers.

        Raises:
            OSError: naming the URL, what is wrong and the fix.
        """
        probe = f"{self.url}/.trainwright-write-check-{secrets.token_hex(4)}"
        try:
            _within(lambda: (self.fs.pipe_file(probe, b"ok"), self.fs.rm_file(probe)), self.attempt_timeout_s)
        except Exception as e:  # noqa: BLE001 - classified below
            raise OSError(
                f"Cannot write to {self.url} ({purpose}): {self.explain(e)}. Nothing was trained or written."
            ) from e
        self.checked = True

    def explain(self, e: BaseException) -> str:
        """What an error of this store means and how to fix it (bucket, credentials, endpoint)."""
        text = f"{type(e).__name__}: {e}"
        low = text.lower()
        endpoint = (
            (self.options.get("client_kwargs") or {}).get("endpoint_url")
            or self.options.get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        if isinstance(e, FileNotFoundError) or "nosuchbucket" in low or "bucket does not exist" in low:
            return (
                f"the bucket does not exist ({text}). Create it (e.g. `aws s3 mb "
                f"{self.url.split('/')[0]}//{self.url.split('/')[2]}`) or fix the URL"
            )
        if isinstance(e, PermissionError) or any(
            s in low
            for s in (
                "accessdenied",
                "access denied",
                "invalidaccesskeyid",
                "signaturedoesnotmatch",
                "forbidden",
                "credentials",
            )
        ):
            return (
                f"access denied ({text}). Check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or "
                "AWS_PROFILE in the environment, "
                "or storage_options=dict(key=..., secret=...)) and that they may write to this bucket"
            )
        if any(s in low for s in ("connect", "endpoint", "timeout", "timed out", "unreachable", "name resolution")):
            return (
                f"cannot reach the storage endpoint{f' {endpoint}' if endpoint else ''} ({text}). Check the endpoint "
                "(storage_options=dict(client_kwargs=dict(endpoint_url=...)) or AWS_ENDPOINT_URL) and the network"
            )
        return (
            f"{text}. Check the URL, the credentials and the endpoint (storage_options= or the AWS_* environment "
            "variables)"
        )
