"""The checkpoint as one mapping of Stateful pieces: what a user sees when saving and resuming.

Hooks that extend the checkpoint, validation before anything changes (optimizer class and
parameter groups), user objects registered with ``register_stateful``, every read and write
through the strategy, and the position in the epoch stored once (in ``progress``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import chaos_train as ct
import numpy as np
import pytest
import torch

import trainwright as tw
from trainwright.checkpoint import Stateful, load_file, read_latest
from trainwright.hooks.hook import Hook
from trainwright.optim import OptimWrapper
from trainwright.strategies.single_device import SingleDeviceStrategy

SHORT = dict(train_cfg=dict(by_epoch=True, max_epochs=1), param_scheduler=None, val_dataloader=None, val_evaluator=None)


def _checkpointed_run(work: Path, **kw: Any) -> Path:
    """Train one epoch (15 iterations), checkpointing every 4; return ``iter_4.pth``."""
    ct.build(
        str(work), checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=-1, save_best=None), **{**SHORT, **kw}
    ).train()
    return work / "checkpoints" / "iter_4.pth"


def _assert_same(a: Any, b: Any) -> None:
    from test_chaos import _assert_same_tensors

    _assert_same_tensors(a, b)


# ----------------------------------------------------------------------- before_save_checkpoint


class AddExtra(Hook):
    def __init__(self, value: Any) -> None:
        self.value = value
        self.loaded: Any = None

    def before_save_checkpoint(self, trainer: tw.Trainer, checkpoint: dict) -> None:  # noqa: D102
        checkpoint["extra"] = self.value

    def after_load_checkpoint(self, trainer: tw.Trainer, checkpoint: dict) -> None:  # noqa: D102
        self.loaded = checkpoint.get("extra")


def test_a_hook_adding_an_object_gets_a_save_time_error_naming_the_key(tmp_path: Path) -> None:
    class Opaque:
        pass

    t = ct.build(
        str(tmp_path), hooks=[AddExtra(Opaque())], checkpoint=dict(interval=4, by_epoch=False, save_best=None), **SHORT
    )
    with pytest.raises(TypeError, match=r"checkpoint\['extra'\] is a .*Opaque.*weights_only"):
        t.train()
    assert not list((tmp_path / "checkpoints").glob("*.pth")), "a checkpoint the safe loader refuses was written"


def test_a_hook_adding_a_numpy_array_writes_a_checkpoint_that_resumes(tmp_path: Path) -> None:
    path = _checkpointed_run(tmp_path / "a", hooks=[AddExtra(np.arange(3))])
    assert torch.equal(load_file(path)["extra"], torch.arange(3))
    probe = AddExtra(np.arange(3))
    t = ct.build(str(tmp_path / "a"), experiment="b", hooks=[probe], resume=str(path), **SHORT)
    t.train()
    assert torch.equal(probe.loaded, torch.arange(3)) and t.progress.iteration == 15


# ----------------------------------------------------------------------- validation before loading


def _untouched_after_refused_resume(
    t: tw.Trainer, path: Path, match: str, optimizer: torch.optim.Optimizer | None = None
) -> None:
    model_before = copy.deepcopy(t.unwrapped_model.state_dict())
    optim_before = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
    progress_before = t.progress.state_dict()
    with pytest.raises(ValueError, match=match) as err:
        t.resume_from(path)
    assert str(path) in str(err.value)  # names the file
    _assert_same(t.unwrapped_model.state_dict(), model_before)
    assert t.progress.state_dict() == progress_before
    if optim_before is not None:
        assert t.optim_wrapper.optimizer.state_dict() == optim_before
    assert t.optim_wrapper.optimizer.state_dict()["state"] == {}  # no momentum loaded
    loader = t.train_loop.dataloader
    assert (loader.epoch, loader.position) == (0, 0)
    ckpt_hook = t.hooks.get("CheckpointHook")
    assert ckpt_hook.kept == [] and ckpt_hook.state_dict()["last_saved_iter"] == -1


def test_resume_with_other_param_groups_is_refused_before_anything_changes(tmp_path: Path) -> None:
    path = _checkpointed_run(tmp_path / "a")
    assert load_file(path)["optim_wrapper"]["optimizer_class"] == "SGD"
    model = ct.Net()
    net = model.net
    two_groups = torch.optim.SGD(
        [{"params": net[0].parameters()}, {"params": net[3].parameters(), "lr": 0.01}], lr=0.2, momentum=0.9
    )
    t = ct.build(
        str(tmp_path / "b"), model=model, optim_wrapper=OptimWrapper(two_groups, accumulative_counts=2), **SHORT
    )
    _untouched_after_refused_resume(
        t,
        path,
        optimizer=two_groups,
        match=r"iter_4\.pth.*1 parameter group\(s\) of \[4\] parameters, the trainer's has 2 of \[2, 2\]",
    )


def test_resume_with_another_optimizer_class_is_refused_before_anything_changes(tmp_path: Path) -> None:
    path = _checkpointed_run(tmp_path / "a")
    t = ct.build(
        str(tmp_path / "b"), optim_wrapper=dict(optimizer=dict(type="Adam", lr=0.01), accumulative_counts=2), **SHORT
    )
    _untouched_after_refused_resume(
        t, path, r"iter_4\.pth.*optimizer is SGD, the trainer's is Adam.*same optim_wrapper config"
    )


# ----------------------------------------------------------------------- register_stateful


class Counter:
    def __init__(self, n: int = 0) -> None:
        self.n = n

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = int(state["n"])


class CountIters(Hook):
    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    def after_train_iter(
        self, trainer: tw.Trainer, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:  # noqa: D102
        self.counter.n += 10


def test_a_registered_stateful_object_is_saved_and_restored_by_name(tmp_path: Path) -> None:
    counter = Counter()
    assert isinstance(counter, Stateful)
    t = ct.build(
        str(tmp_path / "a"),
        hooks=[CountIters(counter)],
        checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=-1, save_best=None),
        **SHORT,
    )
    t.checkpoints.add("counter", counter)
    t.train()
    path = tmp_path / "a" / "checkpoints" / "iter_8.pth"
    assert load_file(path)["counter"] == {"n": 80}

    fresh = Counter()
    t2 = ct.build(str(tmp_path / "b"), **SHORT)
    t2.checkpoints.add("counter", fresh)
    t2.resume_from(path)
    assert fresh.n == 80 and t2.progress.iteration == 8


def test_register_stateful_refuses_taken_names_and_non_stateful_objects(tmp_path: Path) -> None:
    t = ct.build(str(tmp_path), **SHORT)
    for builtin in ("model", "optim_wrapper", "progress", "rng"):
        with pytest.raises(ValueError, match=f"'{builtin}' is already taken"):
            t.checkpoints.add(builtin, Counter())
    t.checkpoints.add("counter", Counter())
    with pytest.raises(ValueError, match="'counter' is already taken"):
        t.checkpoints.add("counter", Counter())
    with pytest.raises(TypeError, match="state_dict"):
        t.checkpoints.add("nope", object())  # type: ignore[arg-type]


def test_a_piece_check_refuses_before_any_piece_loads_and_a_missing_piece_warns(tmp_path: Path) -> None:
    path = _checkpointed_run(tmp_path / "a")

    class Picky(Counter):
        def check_state_dict(self, state: dict[str, Any]) -> None:
            raise ValueError("picky refuses")

    t = ct.build(str(tmp_path / "b"), **SHORT)
    t.checkpoints.add("picky", Picky())
    src = torch.load(path, weights_only=True)
    src["picky"] = {"n": 1}
    torch.save(src, tmp_path / "with_picky.pth")
    before = copy.deepcopy(t.unwrapped_model.state_dict())
    with pytest.raises(ValueError, match=r"with_picky\.pth.*picky refuses"):
        t.resume_from(tmp_path / "with_picky.pth")
    _assert_same(t.unwrapped_model.state_dict(), before)
    assert t.progress.iteration == 0

    t2 = ct.build(str(tmp_path / "c"), **SHORT)
    absent = Counter(5)
    t2.checkpoints.add("absent", absent)
    with pytest.warns(UserWarning, match=r"iter_4\.pth.*'absent'"):
        t2.resume_from(path)
    assert absent.n == 5 and t2.progress.iteration == 4


# ----------------------------------------------------------------------- strategy-owned I/O


class RecordingStrategy(SingleDeviceStrategy):
    """A single-device strategy that records the checkpoint calls it serves."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.calls: list[tuple[str, Any]] = []

    def save_checkpoint(self, path: Any, state: Any, *, async_save: bool = False, after: Any = None) -> None:  # noqa: D102
        self.calls.append(("save", (Path(path).name, async_save)))
        super().save_checkpoint(path, state, async_save=async_save, after=after)

    def load_checkpoint(self, path: Any, map_location: Any = "cpu") -> dict[str, Any]:  # noqa: D102
        self.calls.append(("load", Path(path).name))
        return super().load_checkpoint(path, map_location)

    def find_resumable(self, ckpt_dir: Any) -> Any:  # noqa: D102
        self.calls.append(("find", Path(ckpt_dir).name))
        return super().find_resumable(ckpt_dir)


@pytest.mark.parametrize("async_save", [False, True])
def test_every_checkpoint_is_written_and_read_through_the_strategy(tmp_path: Path, async_save: bool) -> None:
    s = RecordingStrategy()
    ct.build(
        str(tmp_path),
        strategy=s,
        async_save=async_save,
        checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=2),
        epochs=1,
    ).train()
    saves = [args for kind, args in s.calls if kind == "save"]
    assert [name for name, _ in saves if not name.startswith("best_")] == [
        "iter_4.pth",
        "iter_8.pth",
        "iter_12.pth",
        "epoch_1.pth",
    ]
    assert {a for _, a in saves} == {async_save}
    d = tmp_path / "checkpoints"
    on_disk = {p.name for p in d.glob("*.pth")}
    assert on_disk <= {name for name, _ in saves} and any(n.startswith("best_") for n in on_disk)
    assert read_latest(d) == "epoch_1.pth"
    assert on_disk - {n for n in on_disk if n.startswith("best_")} == {
        "iter_12.pth",
        "epoch_1.pth",
    }  # keep-2 applied after each write
    for name in on_disk:
        assert {"model", "optim_wrapper", "progress", "rng"} <= set(load_file(d / name))  # complete files

    s2 = RecordingStrategy()
    ct.build(str(tmp_path), experiment="b", strategy=s2, epochs=2).train()
    assert s2.calls[0] == ("find", "checkpoints")  # resume=True discovers through the strategy


def test_preemption_without_checkpoint_hook_saves_through_the_strategy(tmp_path: Path) -> None:
    from test_preemption import SendSignal

    s = RecordingStrategy()
    t = ct.build(
        str(tmp_path),
        strategy=s,
        hooks=[SendSignal(at=5)],
        default_hooks=dict(checkpoint=None, preemption=dict(exit_code=None)),
    )
    t.train()
    assert s.calls == [("find", "checkpoints"), ("save", ("iter_5.pth", False))]
    assert read_latest(tmp_path / "checkpoints") == "iter_5.pth"


def test_request_checkpoint_is_served_by_the_checkpoint_hook_while_training(tmp_path: Path) -> None:
    got: list[Any] = []

    class Ask(Hook):
        priority = "LOWEST"

        def after_train_iter(
            self, trainer: tw.Trainer, batch_idx: int, data_batch: Any = None, outputs: Any = None
        ) -> None:  # noqa: D102
            if trainer.progress.iteration in (3, 4):
                got.append(trainer.checkpoints.save_now())

    t = ct.build(
        str(tmp_path),
        hooks=[Ask()],
        checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=1, save_best=None),
        **SHORT,
    )
    t.train()
    d = tmp_path / "checkpoints"
    assert got == [d / "iter_3.pth", None]  # the hook's naming; iteration 4 was saved by its interval already
    assert sorted(p.name for p in d.glob("*.pth")) == ["epoch_1.pth"]  # the hook's keep-1 rule covered iter_3 too


# ----------------------------------------------------------------------- position stored once


class RecordBatches(Hook):
    priority = "LOWEST"

    def __init__(self) -> None:
        self.labels: dict[int, torch.Tensor] = {}

    def after_train_iter(
        self, trainer: tw.Trainer, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:  # noqa: D102
        self.labels[trainer.progress.iteration] = data_batch[1].clone()


def test_the_checkpoint_holds_the_position_once_and_resume_follows_progress(tmp_path: Path) -> None:
    ref = RecordBatches()
    path = _checkpointed_run(tmp_path / "a", hooks=[ref])
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["progress"] == {"epoch": 0, "iteration": 4, "iter_in_epoch": 4}
    assert (
        set(ckpt["train_dataloader"]) == {"seed", "shape"} and ckpt["train_dataloader"]["seed"] == 7
    )  # no second copy of epoch / position
    assert set(ckpt["train_dataloader"]["shape"]) == {
        "batch_size",
        "dataset_len",
        "drop_last",
        "num_replicas",
        "batches",
    }

    ckpt["progress"].update(iteration=6, iter_in_epoch=6)  # move the position in the one place it is kept
    torch.save(ckpt, tmp_path / "moved.pth")
    rec = RecordBatches()
    t = ct.build(str(tmp_path / "b"), hooks=[rec], resume=str(tmp_path / "moved.pth"), **SHORT)
    t.train()
    assert min(rec.labels) == 7
    for it in range(7, 16):  # the data order continues at batch 7 of epoch 0
        assert torch.equal(rec.labels[it], ref.labels[it]), it


def test_make_safe_keeps_plain_containers_converts_numpy_and_names_the_bad_key_path() -> None:
    import random

    from trainwright.checkpoint.stateful import make_safe

    rng = random.getstate()  # a tuple holding a tuple of 625 ints: returned as it is, not rebuilt
    state = {"rng": rng, "w": torch.ones(2), "steps": [1, 2.5, "x", None]}
    assert make_safe(state) is state
    converted = make_safe({"a": [1, np.int64(3), np.arange(2)], "b": (np.float32(0.5),)})
    assert converted["a"][:2] == [1, 3] and type(converted["a"][1]) is int
    assert torch.equal(converted["a"][2], torch.arange(2)) and converted["b"] == (0.5,)
    with pytest.raises(
        TypeError, match=r"checkpoint\['a'\]\[1\]\['k'\] is a builtins\.object, which a checkpoint cannot hold"
    ):
        make_safe({"a": [0, {"k": object()}]})
