"""The CheckpointManager used directly, without a Trainer: a couple of plain Stateful pieces and the single-device
strategy."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from trainwright.checkpoint import load_file, read_latest
from trainwright.checkpoint.manager import CheckpointManager
from trainwright.strategies import SingleDeviceStrategy
from trainwright.utils.progress import Progress


class Counter:
    def __init__(self, n: int = 0) -> None:
        self.n = n

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = int(state["n"])


class Weights:
    """A piece with a check: refuses a state of another length before anything loads."""

    def __init__(self, size: int) -> None:
        self.w = torch.zeros(size)

    def state_dict(self) -> dict[str, Any]:
        return {"w": self.w.clone()}

    def check_state_dict(self, state: dict[str, Any]) -> None:
        if state["w"].shape != self.w.shape:
            raise ValueError(f"w has shape {tuple(state['w'].shape)}, this piece {tuple(self.w.shape)}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.w = state["w"].clone()


def _manager(
    d: Path, keep: int = -1, size: int = 3, **kwargs: Any
) -> tuple[CheckpointManager, Counter, Weights, Progress]:
    strategy = SingleDeviceStrategy(device="cpu")
    counter, weights, progress = Counter(), Weights(size), Progress()
    m = CheckpointManager(
        strategy,
        {"counter": counter, "weights": weights, "progress": progress},
        d,
        progress=progress,
        keep=keep,
        **kwargs,
    )
    return m, counter, weights, progress


def _train_to(m: CheckpointManager, counter: Counter, weights: Weights, progress: Progress, it: int) -> None:
    progress.iteration = it
    counter.n = it * 10
    weights.w += 1


def test_save_points_latest_at_each_periodic_checkpoint_and_keeps_k(tmp_path: Path) -> None:
    m, counter, weights, progress = _manager(tmp_path, keep=2)
    for it in (1, 2, 3):
        _train_to(m, counter, weights, progress, it)
        path = m.save_periodic(m.name("iter_{}.pth", it))
        assert path == tmp_path / f"iter_{it}.pth" and read_latest(tmp_path) == f"iter_{it}.pth"
    m.strategy.wait_for_checkpoint()  # keep-k deletes a file once the newer one is durable
    assert sorted(p.name for p in tmp_path.glob("*.pth")) == [
        "iter_2.pth",
        "iter_3.pth",
    ]  # iter_1 fell out of the window
    assert m.record.kept == ["iter_2.pth", "iter_3.pth"] and m.record.last_saved_iter == 3
    ckpt = load_file(tmp_path / "iter_3.pth")
    assert list(ckpt) == ["counter", "weights", "progress", "rng"]  # the pieces in order, rng last
    assert ckpt["counter"] == {"n": 30} and torch.equal(ckpt["weights"]["w"], torch.full((3,), 3.0))


def test_save_now_skips_an_iteration_saved_already_and_names_epoch_ends(tmp_path: Path) -> None:
    m, counter, weights, progress = _manager(tmp_path)
    _train_to(m, counter, weights, progress, 4)
    assert m.save_now() == tmp_path / "iter_4.pth"
    assert m.save_now() is None  # just saved
    m.configure(epoch_names=True)
    progress.epoch, progress.iteration, progress.iter_in_epoch = 1, 8, 0
    assert m.save_now() == tmp_path / "epoch_1.pth" and read_latest(tmp_path) == "epoch_1.pth"


def test_best_k_keeps_the_best_scores_and_deletes_the_one_that_falls_out(tmp_path: Path) -> None:
    m, *_ = _manager(tmp_path)
    assert m.save_best("acc", 0.5, "best_acc_1.pth", greater=True, keep=2) is not None
    assert m.save_best("acc", 0.7, "best_acc_2.pth", greater=True, keep=2) is not None
    assert m.save_best("acc", 0.6, "best_acc_3.pth", greater=True, keep=2) is not None
    assert m.save_best("acc", 0.1, "best_acc_4.pth", greater=True, keep=2) is None  # not among the best 2: not written
    assert m.record.best == {"acc": [(0.7, "best_acc_2.pth"), (0.6, "best_acc_3.pth")]}
    m.strategy.wait_for_checkpoint()  # the file that fell out goes once the new one is durable
    assert sorted(p.name for p in tmp_path.glob("*.pth")) == ["best_acc_2.pth", "best_acc_3.pth"]
    assert read_latest(tmp_path) is None  # best checkpoints are not resume candidates


def test_find_and_restore_checks_every_piece_then_loads_each_with_rng_last(tmp_path: Path) -> None:
    m, counter, weights, progress = _manager(tmp_path / "ckpt")
    _train_to(m, counter, weights, progress, 5)
    random.seed(1)
    m.save_periodic("iter_5.pth")
    expected = random.random()

    seen: list[dict] = []
    fresh, c2, w2, p2 = _manager(tmp_path / "ckpt", after_load=lambda ckpt: (seen.append(ckpt), random.random()))
    random.seed(99)
    found = fresh.find_and_restore()
    assert found is not None and found[0] == tmp_path / "ckpt" / "iter_5.pth"
    assert (c2.n, p2.iteration) == (50, 5) and torch.equal(w2.w, weights.w)
    assert len(seen) == 1 and random.random() == expected  # rng restored after the after_load callable drew a number

    other, c3, w3, p3 = _manager(tmp_path / "other", size=4)
    with pytest.raises(ValueError, match=r"iter_5\.pth.*does not fit.*shape \(3,\)"):
        other.find_and_restore(tmp_path / "ckpt" / "iter_5.pth")
    assert (c3.n, p3.iteration) == (0, 0)  # checked before anything loaded


def test_find_and_restore_in_an_empty_folder_finds_nothing_and_a_missing_piece_warns(tmp_path: Path) -> None:
    m, *_ = _manager(tmp_path / "empty")
    assert m.find_and_restore() is None
    src, counter, weights, progress = _manager(tmp_path / "a")
    src.save("x.pth")
    m.add("extra", Counter())
    with pytest.warns(UserWarning, match="holds no 'extra' state"):
        m.find_and_restore(tmp_path / "a" / "x.pth")
    with pytest.raises(ValueError, match="'extra' is already taken"):
        m.add("extra", Counter())


def test_flush_runs_once_before_collecting_and_before_save_edits_the_dict(tmp_path: Path) -> None:
    calls: list[str] = []

    def before_save(ckpt: dict) -> None:
        calls.append("before_save")
        ckpt["note"] = {"by": "hook"}

    m, *_ = _manager(tmp_path, flush=lambda: calls.append("flush"), before_save=before_save)
    m.save("a.pth", exclude=("weights",))
    assert calls == ["flush", "before_save"]
    ckpt = load_file(tmp_path / "a.pth")
    assert "weights" not in ckpt and ckpt["note"] == {"by": "hook"}


def test_publish_strips_to_the_keys_and_names_the_hash(tmp_path: Path) -> None:
    import hashlib

    m, *_ = _manager(tmp_path)
    path = m.save("epoch_1.pth")
    out = m.publish(path, ["counter"])
    assert list(load_file(out)) == ["counter"]
    assert out.name == f"epoch_1-{hashlib.sha256(out.read_bytes()).hexdigest()[:8]}.pth"
    with pytest.raises(ValueError, match="'state_dict' is not a key"):
        m.check_keys(["state_dict"])


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    m, *_ = _manager(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    dead = tmp_path / ".iter_3.pth.tmp.999999999.abcdef"  # a pid that does not exist
    dead.write_bytes(b"torn")
    kept = tmp_path / "iter_2.pth"
    kept.write_bytes(b"x")
    m.clean_stale_tmp()
    assert not dead.exists() and kept.exists()
