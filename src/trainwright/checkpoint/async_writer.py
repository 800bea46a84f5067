"""Write checkpoints in a background thread so training only waits for a copy to host memory.

:class:`AsyncCheckpointWriter`: a save returns once every tensor is copied into reused CPU
staging buffers; a writer thread then writes the file (complete or absent), then ``latest``
and the keep-k deletions, one write at a time. Call :meth:`~AsyncCheckpointWriter.wait`
before the process exits: it waits for the pending write and re-raises its error.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from trainwright.checkpoint.io import atomic_save


def snapshot(obj: Any) -> Any:
    """A copy of ``obj`` whose tensors are fresh CPU copies that no later training step can change.

    Containers are rebuilt (dicts keep their type for ``OrderedDict`` state dicts and their
    ``_metadata``); non-tensor leaves are shared (they are immutable or rebuilt by the
    ``state_dict()`` calls that produced them). The copy is the caller's to keep
    (:meth:`~trainwright.checkpoint.CheckpointManager.capture`); a background save copies
    into reused buffers instead (:class:`AsyncCheckpointWriter`).
    """
    return _rebuild(obj, _fresh_copy)


def _fresh_copy(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()


def _rebuild(obj: Any, leaf: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with containers rebuilt and every tensor replaced by ``leaf(tensor)``, depth first in order."""
    if isinstance(obj, torch.Tensor):
        return leaf(obj)
    if isinstance(obj, Mapping):
        out: Any = type(obj)() if type(obj) is not dict and _default_constructible(type(obj)) else {}
        for k, v in obj.items():
            out[k] = _rebuild(v, leaf)
        meta = getattr(obj, "_metadata", None)
        if meta is not None:
            out._metadata = meta  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list):
        return [_rebuild(v, leaf) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_rebuild(v, leaf) for v in obj)
    return obj


def _tensors(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    """Append the tensors of ``obj`` to ``out`` in the order :func:`_rebuild` visits them."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            _tensors(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tensors(v, out)
    return out


def _default_constructible(cls: type) -> bool:
    try:
        cls()
    except Exception:  # noqa: BLE001 - any failure means "use a plain dict"
        return False
    return True


_ALIGN = 64  # bytes between staged tensors in an arena (any dtype's alignment, a cache line)
_COPY, _COPY_CUDA, _SHARED, _FRESH = range(4)  # how a leaf is staged (see _Staging.kinds)
_INT_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    }
)


def _stageable(t: torch.Tensor) -> bool:
    """A dense tensor of a byte-addressable dtype (others are copied fresh each save, as :func:`snapshot` does)."""
    return (
        t.layout == torch.strided
        and not t.is_nested
        and not t.is_quantized
        and t.device.type != "meta"
        and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype in _INT_DTYPES)
    )


def _dense_strides(t: torch.Tensor) -> tuple[int, ...]:
    """``t``'s strides if it covers its memory without gaps or overlaps (any dim order), else contiguous strides."""
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            break
        expected *= sz
    else:
        return tuple(t.stride())
    strides, acc = [0] * t.dim(), 1
    for i in reversed(range(t.dim())):
        strides[i], acc = acc, acc * max(t.shape[i], 1)
    return tuple(strides)


class _Staging:
    """CPU buffers for one state structure: filled by every save, reallocated only when the structure changes.

    The staged tensors live in one byte arena per kind (pageable for CPU tensors, pinned for
    GPU ones); each is a tensor with its own storage over its part of the arena, so
    ``torch.save`` writes each one alone, as it writes the live tensors. A tensor that
    appears twice (tied weights) is staged once and saved shared, as ``torch.save`` saves it.
    """

    def __init__(self) -> None:
        self.layout: list[tuple[Any, ...] | None] | None = None
        self.targets: list[torch.Tensor | None] = []
        #: per leaf: _COPY (``copy_`` into pageable memory), _COPY_CUDA (``copy_`` into pinned memory, queued
        #: on the current stream), _SHARED (staged with an earlier leaf over the same memory), _FRESH (not
        #: stageable: copied fresh)
        self.kinds: list[int] = []
        self.cuda_devices: set[torch.device] = set()
        self.nbytes = 0
        self.allocations = 0
        self._unpin: Callable[[], None] | None = None

    def copy(self, obj: Any) -> Any:
        """``obj`` rebuilt with every tensor copied into the staging buffers; blocks until the copies are complete."""
        leaves = _tensors(obj, [])
        layout: list[tuple[Any, ...] | None] = []
        first: dict[tuple[Any, ...], int] = {}
        for i, t in enumerate(leaves):
            if (
                type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter
            ):  # subclasses (DTensor...): copied fresh
                layout.append(None)
                continue
            try:
                lazy = t.dtype.is_complex and (
                    t.is_conj() or t.is_neg()
                )  # a lazy conjugate is other values over the same memory
                entry = (t.dtype, t.device, t.shape, None if t.is_contiguous() else t.stride(), lazy)
                ptr = t.data_ptr()
            except RuntimeError:  # sparse, nested...: no strides or no single storage, copied fresh
                layout.append(None)
                continue
            layout.append((*entry, first.setdefault((ptr, *entry), i)))  # the first leaf over the same memory
        if layout != self.layout:
            self._allocate(leaves, layout)
        with torch.no_grad():
            out: list[torch.Tensor] = []
            for t, dst, kind in zip(leaves, self.targets, self.kinds):
                if dst is None:
                    out.append(_fresh_copy(t))
                    continue
                if kind == _COPY:
                    dst.copy_(t)
                elif kind == _COPY_CUDA:
                    dst.copy_(t, non_blocking=True)
                out.append(dst)
        for (
            device
        ) in self.cuda_devices:  # the copies were queued on the current stream, behind every step already queued
            torch.cuda.current_stream(device).synchronize()
        staged = iter(out)
        return _rebuild(obj, lambda _: next(staged))

    def _allocate(self, leaves: list[torch.Tensor], layout: list[tuple[Any, ...] | None]) -> None:
        self.release()
        kinds: list[int] = []
        offsets: dict[int, int] = {}
        size = {False: 0, True: 0}  # arena bytes, by "pinned"
        for i, (t, entry) in enumerate(zip(leaves, layout)):
            if entry is None or not _stageable(t) or (entry[-1] != i and kinds[entry[-1]] == _FRESH):
                kinds.append(_FRESH)
            elif entry[-1] != i:
                kinds.append(_SHARED)
            else:
                pinned = t.device.type == "cuda"
                kinds.append(_COPY_CUDA if pinned else _COPY)
                offsets[i] = -(-size[pinned] // _ALIGN) * _ALIGN
                size[pinned] = offsets[i] + t.numel() * t.element_size()
        arenas = {pinned: torch.empty(n, dtype=torch.uint8) for pinned, n in size.items() if n}
        if True in arenas:
            self._unpin = _pin(self, arenas[True])
        views = {pinned: a.numpy() for pinned, a in arenas.items()}
        targets: list[torch.Tensor | None] = []
        for i, (t, entry, kind) in enumerate(zip(leaves, layout, kinds)):
            if kind == _FRESH or entry is None:
                targets.append(None)
            elif kind == _SHARED:
                targets.append(targets[entry[-1]])
            else:
                nbytes = t.numel() * t.element_size()
                if nbytes:
                    raw = torch.from_numpy(views[kind == _COPY_CUDA][offsets[i] : offsets[i] + nbytes])
                else:
                    raw = torch.empty(0, dtype=torch.uint8)
                targets.append(raw.view(t.dtype).as_strided(t.shape, _dense_strides(t)))
        self.layout, self.targets, self.kinds = layout, targets, kinds
        self.cuda_devices = {t.device for t, kind in zip(leaves, kinds) if kind == _COPY_CUDA}
        self.nbytes = sum(size.values())
        self.allocations += 1

    def release(self) -> None:
        """Drop the buffers (the next save allocates new ones); a pinned arena is unpinned first."""
        if self._unpin is not None:
            self._unpin()
            self._unpin = None
        self.layout, self.targets, self.kinds, self.cuda_devices, self.nbytes = None, [], [], set(), 0


def _pin(owner: object, arena: torch.Tensor) -> Callable[[], None]:
    """Page-lock ``arena`` for fast, asynchronous copies from the GPU until the returned callable (or ``owner``'s end)
    unpins it.

    ``cudaHostRegister`` on memory we allocated keeps its exact size (``pin_memory=True``
    rounds an allocation up to a power of two), as torch's own DCP staging does.

    Raises:
        RuntimeError: the memory could not be page-locked (names the CUDA error).
    """
    cudart = torch.cuda.cudart()
    err = int(cudart.cudaHostRegister(arena.data_ptr(), arena.numel(), 1))  # 1: cudaHostRegisterPortable (every device)
    if err != 0:
        raise RuntimeError(
            f"Could not page-lock {arena.numel() / 2**20:.0f} MiB of host memory for the async checkpoint's staging "
            "buffers "
            f"(cudaHostRegister returned cudaError {err}). Free host memory, or save synchronously (async_save=False)."
        )
    # the finalizer holds the arena until it has unregistered it: memory is never freed while pinned
    return weakref.finalize(owner, lambda a: cudart.cudaHostUnregister(a.data_ptr()), arena)


def _after(event: threading.Event, fn: Callable[..., None], *args: Any) -> None:
    event.wait()
    fn(*args)


class AsyncCheckpointWriter:
    """One background thread at a time that writes a snapshot and then runs follow-up work.

    The staging buffers are allocated by the first save and reused by the next ones while the
    state keeps its structure (tensor shapes, dtypes, devices), so a save is one memory copy
    without new allocations; they are pinned when the tensors are on a GPU and hold as much
    host memory as the checkpoint's tensors until :meth:`release`. The file holds the state as
    it was when :meth:`submit` returned. The thread serialises, writes a temporary file, fsyncs
    and renames, then runs ``after``, in that order, so ``latest`` names a complete file and old
    files go only after the new one is complete. At most one write is in flight: a save waits
    for the previous write before it refills the buffers (a run that saves faster than the disk
    slows to the disk's pace).

    Example::

        writer = AsyncCheckpointWriter()
        writer.submit(state, "ckpt/iter_100.pth", after=lambda: write_latest("ckpt", "iter_100.pth"))
        ...                       # training goes on while the file is written
        writer.wait()             # before exiting: the file is on disk, errors re-raised
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._staging = _Staging()
        self.last_path: Path | None = None

    @property
    def pending(self) -> bool:
        """True while a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def staged_bytes(self) -> int:
        """Host memory the staging buffers hold (0 before the first save and after :meth:`release`)."""
        return self._staging.nbytes

    @property
    def staging_allocations(self) -> int:
        """How many times the staging buffers were allocated: once per run, again only when the state's structure
        changed."""
        return self._staging.allocations

    def submit(
        self,
        state: Mapping[str, Any],
        path: str | Path,
        after: Callable[[], None] | None = None,
        copy: bool = True,
        write: Callable[[Mapping[str, Any], Any], object] | None = None,
    ) -> None:
        """Wait for the previous write, copy ``state`` into the staging buffers and write it to ``path`` in the
        background.

        Returns once the copy is complete: from then on training may change the live tensors.
        The staged copy belongs to the writer thread until the next ``submit`` refills it.

        Args:
            state: The checkpoint dict (may share tensors with the live model).
            path: Target file, written atomically.
            after: Runs in the writer thread once the file is complete (pointer update,
                deleting old checkpoints); skipped if the write failed.
            copy: Snapshot the tensors first (set False only if ``state`` is already a
                private copy).
            write: Writes the snapshot to ``path`` in the thread (default :func:`atomic_save`;
                a remote checkpoint's upload, whose ``path`` is a URL object, is another).

        Raises:
            BaseException: the previous write's error, if it failed.
        """
        self.wait()  # the previous write no longer reads the staging buffers
        data = self._staging.copy(state) if copy else state
        target = Path(path) if write is None else path
        go = threading.Event()  # the writer starts once submit has returned the GIL to the training thread
        self._thread = threading.Thread(
            target=_after,
            args=(go, self._write, data, target, after, write),
            name=f"checkpoint-writer:{getattr(target, 'name', target)}",
            daemon=False,
        )
        self._thread.start()
        go.set()

    def _write(
        self,
        data: Mapping[str, Any],
        path: Any,
        after: Callable[[], None] | None,
        write: Callable[[Mapping[str, Any], Any], object] | None = None,
    ) -> None:
        try:
            (write or atomic_save)(data, path)
            self.last_path = path
            if after is not None:
                after()
        except BaseException as e:  # noqa: BLE001 - handed to the training thread by wait()
            self._error = e

    def wait(self) -> None:
        """Block until the pending write (if any) is complete; re-raise its error."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if isinstance(error, OSError):
            raise error  # names the file, says nothing was replaced and what to do (atomic_write)
        if error is not None:
            raise RuntimeError(
                f"Writing a checkpoint in the background failed: {error}. The previous complete checkpoint is still on "
                "disk; check free space and permissions of the checkpoint directory."
            ) from error

    def release(self) -> None:
        """Wait for the pending write (re-raising its error), then free the staging buffers; a later save allocates
        them again."""
        try:
            self.wait()
        finally:
            self._staging.release()
