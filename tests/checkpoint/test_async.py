"""Background checkpoint writes: snapshot isolation, one write at a time, errors surface, same files."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import chaos_train as ct
import pytest
import torch

from trainwright.checkpoint import load_file, read_latest
from trainwright.checkpoint.async_writer import AsyncCheckpointWriter, snapshot


def test_snapshot_is_isolated_from_later_training_steps(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 3)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    release = threading.Event()
    w = AsyncCheckpointWriter()
    w.submit({"model": model.state_dict()}, tmp_path / "a.pth", after=release.wait)
    with torch.no_grad():  # the next "optimizer step" changes the weights in place
        model.weight.add_(1.0)
        model.bias.zero_()
    release.set()
    w.wait()
    got = load_file(tmp_path / "a.pth")["model"]
    for k, v in expected.items():
        assert torch.equal(got[k], v), k


def test_snapshot_keeps_state_dict_metadata() -> None:
    sd = torch.nn.BatchNorm1d(3).state_dict()
    snap = snapshot(sd)
    assert type(snap) is type(sd) and snap._metadata == sd._metadata  # type: ignore[attr-defined]
    assert all(snap[k].data_ptr() != v.data_ptr() for k, v in sd.items() if v.numel())


def test_at_most_one_write_in_flight(tmp_path: Path) -> None:
    release = threading.Event()
    w = AsyncCheckpointWriter()
    w.submit({"x": torch.zeros(2)}, tmp_path / "1.pth", after=release.wait)
    assert w.pending
    done = threading.Event()

    def second() -> None:
        w.submit({"x": torch.ones(2)}, tmp_path / "2.pth")
        done.set()

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.2)
    assert not done.is_set(), "a second write started while the first was still in flight"
    release.set()
    t.join(5)
    assert done.is_set()
    w.wait()
    assert torch.equal(load_file(tmp_path / "2.pth")["x"], torch.ones(2))


def test_write_error_is_raised_by_wait_and_leaves_no_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the checkpoint directory should be")
    w = AsyncCheckpointWriter()
    ran = []
    w.submit({"x": torch.zeros(1)}, blocker / "a.pth", after=lambda: ran.append(1))
    with pytest.raises(
        OSError, match="previous checkpoint and `latest` are as they were"
    ) as e:  # the real cause, with the path
        w.wait()
    assert e.value.filename == str(blocker / "a.pth")
    assert ran == []  # the pointer / deletions never run after a failed write
    w.wait()  # the error is reported once


def test_async_and_sync_runs_write_the_same_checkpoints(tmp_path: Path) -> None:
    for mode in ("sync", "async"):
        ct.build(
            str(tmp_path / mode),
            async_save=mode == "async",
            checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=3),
        ).train()
    names = {p.name for p in (tmp_path / "sync" / "checkpoints").iterdir()}
    assert names == {p.name for p in (tmp_path / "async" / "checkpoints").iterdir()}
    assert read_latest(tmp_path / "async" / "checkpoints") == read_latest(tmp_path / "sync" / "checkpoints")
    from test_chaos import _assert_same_tensors

    for name in names - {"latest"}:
        a = load_file(tmp_path / "sync" / "checkpoints" / name)
        b = load_file(tmp_path / "async" / "checkpoints" / name)
        a.pop("meta"), b.pop("meta")
        a.pop("metric_store"), b.pop("metric_store")  # holds iteration times (the logger hook keeps no copy)
        _assert_same_tensors(a, b, name)


# -- staging buffers: the file is the state at submit, buffers reused, a new structure reallocated ----------


def _hold_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Writer threads wait for the returned event before they read the snapshot (a slow disk, made deterministic)."""
    from trainwright.checkpoint import async_writer

    release, real = threading.Event(), async_writer.atomic_save

    def held(obj: object, path: object) -> None:
        assert release.wait(30), "test never released the write"
        real(obj, path)  # type: ignore[arg-type]

    monkeypatch.setattr(async_writer, "atomic_save", held)
    return release


def _train_state() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, opt)
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """One training step: the forward changes BatchNorm's buffers, the step changes params and Adam's state in place."""
    model(torch.randn(32, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)


def _assert_bitwise(got: object, want: object, where: str = "checkpoint") -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape, where
        assert torch.equal(_bytes(got), _bytes(want)), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), where
        for k in want:
            _assert_bitwise(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            _assert_bitwise(a, b, f"{where}[{i}]")
    else:
        assert got == want, where


def test_file_is_the_state_at_submit_while_training_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = _hold_writes(monkeypatch)
    model, opt = _train_state()
    w = AsyncCheckpointWriter()
    expected = snapshot(_state(model, opt))
    w.submit(_state(model, opt), tmp_path / "a.pth")
    for _ in range(3):  # training goes on before the writer thread has read anything
        _step(model, opt)
    release.set()
    w.wait()
    _assert_bitwise(load_file(tmp_path / "a.pth"), expected)


def test_second_save_waits_for_the_first_write_before_reusing_the_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = _hold_writes(monkeypatch)
    model, opt = _train_state()
    w = AsyncCheckpointWriter()
    first = snapshot(_state(model, opt))
    w.submit(_state(model, opt), tmp_path / "1.pth")
    _step(model, opt)
    second = snapshot(_state(model, opt))
    t = threading.Thread(target=w.submit, args=(_state(model, opt), tmp_path / "2.pth"))
    t.start()
    time.sleep(0.2)
    assert t.is_alive(), "the second save refilled the buffers while the first write had not read them"
    release.set()
    t.join(10)
    _step(model, opt)  # after the second submit returned: must not reach the second file
    w.wait()
    _assert_bitwise(load_file(tmp_path / "1.pth"), first)
    _assert_bitwise(load_file(tmp_path / "2.pth"), second)
    assert w.staging_allocations == 1  # the second save reused the first one's buffers
    assert w.staged_bytes >= sum(t.numel() * t.element_size() for t in second["model"].values())


def test_a_changed_structure_gets_fresh_buffers(tmp_path: Path) -> None:
    w = AsyncCheckpointWriter()
    states = [
        {"w": torch.arange(6.0).reshape(2, 3), "n": 1},
        {"w": torch.arange(6.0).reshape(2, 3) + 1, "n": 2},  # same structure: reused
        {"w": torch.arange(12.0).reshape(3, 4), "n": 3},  # another shape
        {"w": torch.arange(12.0).reshape(3, 4).double(), "n": 4},  # another dtype
        {
            "w": torch.arange(12.0).reshape(3, 4).double(),
            "extra": torch.ones(5, dtype=torch.int64),
            "n": 5,
        },  # one more tensor
        {
            "w": torch.arange(12.0).reshape(4, 3).double().t(),
            "extra": torch.ones(5, dtype=torch.int64),
            "n": 6,
        },  # other strides
    ]
    allocations = []
    for i, state in enumerate(states):
        w.submit(state, tmp_path / f"{i}.pth")
        w.wait()
        _assert_bitwise(load_file(tmp_path / f"{i}.pth"), state)
        allocations.append(w.staging_allocations)
    assert allocations == [1, 1, 2, 3, 4, 5]
    w.release()
    assert w.staged_bytes == 0
    w.submit(states[0], tmp_path / "again.pth")  # a save after release allocates again
    w.wait()
    _assert_bitwise(load_file(tmp_path / "again.pth"), states[0])
    assert w.staging_allocations == 6


def test_every_kind_of_tensor_is_saved_as_a_synchronous_save_saves_it(tmp_path: Path) -> None:
    from trainwright.checkpoint.io import atomic_save

    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied weights: one storage, saved once
    sd = torch.nn.Sequential(emb, head, torch.nn.BatchNorm1d(10)).state_dict()
    c = torch.randn(4, dtype=torch.complex64)
    state = {
        "model": sd,
        "c": c,
        "c_conj": c.conj(),  # the same memory, other values
        "transposed": torch.randn(3, 5).t(),  # dense, not contiguous: strides kept
        "strided": torch.randn(4, 6)[:, ::2],  # gaps: saved contiguous
        "bf16": torch.randn(7).bfloat16(),
        "bool": torch.tensor([True, False]),
        "int8": torch.tensor([-3, 7], dtype=torch.int8),
        "complex": torch.randn(3, dtype=torch.complex64),
        "complex_conj": torch.randn(4, dtype=torch.complex64).conj(),  # a lazy conjugate
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(3.5),
        "sparse": torch.eye(3).to_sparse(),  # not staged: copied fresh, as snapshot() does
        "nested": [1, ("x", torch.full((2,), float("nan")))],
    }
    w = AsyncCheckpointWriter()
    for name in ("1.pth", "2.pth"):
        w.submit(state, tmp_path / name)
        w.wait()
    atomic_save(state, tmp_path / "sync.pth")
    got, want = load_file(tmp_path / "2.pth"), load_file(tmp_path / "sync.pth")
    assert w.staging_allocations == 1
    assert type(got["model"]) is type(sd) and got["model"]._metadata == sd._metadata
    assert got["model"]["0.weight"].data_ptr() == got["model"]["1.weight"].data_ptr()  # still tied after loading
    assert got["transposed"].stride() == want["transposed"].stride() == (1, 5)
    got["sparse"], want["sparse"] = got["sparse"].to_dense(), want["sparse"].to_dense()
    _assert_bitwise(got, want)


def test_a_large_state_with_odd_sizes_and_layouts_is_exact(tmp_path: Path) -> None:
    torch.manual_seed(0)
    state = {  # ~7 MiB of odd sizes, dtypes and layouts, changed in place between the saves
        "a": torch.randn(1_000_003),
        "b": torch.randn(333, 1001).t(),
        "c": torch.randint(0, 2**31, (500_001,), dtype=torch.int64),
        "d": torch.randn(2_000_001).bfloat16(),
        "e": torch.randn(700, 600)[::2, ::3],
        "f": torch.randn(3, 1, 5),
    }
    w = AsyncCheckpointWriter()
    for i in range(2):
        w.submit(state, tmp_path / f"{i}.pth")
        w.wait()
        _assert_bitwise(load_file(tmp_path / f"{i}.pth"), state)
        for v in state.values():
            v.add_(1)
    assert w.staging_allocations == 1


@pytest.mark.cuda
def test_cuda_state_is_staged_at_submit_and_buffers_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = _hold_writes(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.BatchNorm1d(256), torch.nn.Linear(256, 4)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)

    def step() -> None:
        model(torch.randn(32, 64, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad()

    step()
    w = AsyncCheckpointWriter()
    for i in range(2):
        expected = snapshot(_state(model, opt))  # CPU copies, complete before submit
        w.submit(_state(model, opt), tmp_path / f"{i}.pth")
        for _ in range(3):  # queued on the GPU right behind the staging copies
            step()
        release.set()
        w.wait()
        release.clear()
        _assert_bitwise(load_file(tmp_path / f"{i}.pth"), expected)
    assert w.staging_allocations == 1
    release.set()
    w.release()
    assert w.staged_bytes == 0
