"""Resume in-process: a run that crashes and is resumed ends bitwise equal to one that never stopped.

The runs come from ``chaos_train.build`` (dropout, shuffled data with a random
augmentation, accumulation windows that straddle checkpoints, clipping, momentum, an
iteration warm-up then an epoch cosine schedule, validation every epoch). The "crash" is
an exception raised by a hook after a chosen iteration, so the last complete checkpoint
is older than the crash, as after a ``kill -9``.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import chaos_train as ct
import pytest
import torch

import trainwright as tw
from trainwright.checkpoint import UnsafeCheckpointError, list_checkpoints, load_file, read_latest
from trainwright.hooks.hook import Hook


class Crash(RuntimeError):
    """Stands in for a kill: training dies without any cleanup of its own."""


class CrashAt(Hook):
    priority = "LOWEST"

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def after_train_iter(
        self, trainer: tw.Trainer, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        if trainer.progress.iteration == self.iteration:
            raise Crash(f"crash after iteration {self.iteration}")


class Record(Hook):
    """Records, per iteration: the loss tensor, every LR and the batch (inputs and labels)."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.loss: dict[int, torch.Tensor] = {}
        self.lr: dict[int, dict[str, list[float]]] = {}
        self.batch: dict[int, Any] = {}

    def after_train_iter(
        self, trainer: tw.Trainer, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        it = trainer.progress.iteration
        self.loss[it] = outputs["loss"].detach().clone()
        self.lr[it] = trainer.optim_wrapper.get_lr()
        self.batch[it] = [t.clone() for t in data_batch]


def _final_state(trainer: tw.Trainer) -> dict[str, Any]:
    return {"model": trainer.unwrapped_model.state_dict(), "optimizer": trainer.optim_wrapper.optimizer.state_dict()}


def _run(work: Path, experiment: str, crash_at: int | None = None, **kw: Any) -> tuple[tw.Trainer, Record]:
    rec = Record()
    hooks: list[Hook] = [rec] + ([CrashAt(crash_at)] if crash_at is not None else [])
    trainer = ct.build(str(work), experiment=experiment, hooks=hooks, **kw)
    if crash_at is None:
        trainer.train()
    else:
        with pytest.raises(Crash):
            trainer.train()
    trainer.close()
    return trainer, rec


def _same(a: Any, b: Any) -> None:
    from test_chaos import _assert_same_tensors

    _assert_same_tensors(a, b)


@pytest.mark.parametrize(
    ("workers", "crash_at", "checkpoint"),
    [
        (0, 11, dict(interval=3, by_epoch=False)),  # mid-epoch, mid accumulation window (9 is odd)
        (0, 17, dict(interval=1, by_epoch=True)),  # crash in epoch 2: resume from epoch_1 (written after validation)
        (
            0,
            15,
            dict(interval=15, by_epoch=False),
        ),  # checkpoint after the last batch of an epoch, before the epoch closes
        pytest.param(
            2, 23, dict(interval=4, by_epoch=False), marks=[pytest.mark.slow, pytest.mark.timeout(120)]
        ),  # workers, mid-epoch 2
    ],
)
def test_crash_and_resume_is_bitwise(tmp_path: Path, workers: int, crash_at: int, checkpoint: dict[str, Any]) -> None:
    ref, ref_rec = _run(tmp_path / "ref", "ref", workers=workers, checkpoint=checkpoint)
    work = tmp_path / "work"
    _run(work, "a", crash_at=crash_at, workers=workers, checkpoint=checkpoint)
    resumed, rec = _run(work, "b", workers=workers, checkpoint=checkpoint)
    start = min(rec.loss)
    assert 1 < start <= crash_at + 1, f"resumed from iteration {start - 1}, crash was after {crash_at}"
    for it in rec.loss:  # same batches (no replay, no skip), same losses, same LR at every iteration
        _same(rec.batch[it], ref_rec.batch[it])
        assert torch.equal(rec.loss[it], ref_rec.loss[it]), f"loss differs at iteration {it}"
        assert rec.lr[it] == ref_rec.lr[it], f"LR differs at iteration {it}: {rec.lr[it]} != {ref_rec.lr[it]}"
    assert sorted(rec.loss) == list(range(start, 46))
    _same(_final_state(resumed), _final_state(ref))
    _same(resumed.metric_store.state_dict()["loss"]["window"], ref.metric_store.state_dict()["loss"]["window"])


def test_resume_from_explicit_path_and_load_from(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _run(work, "a", crash_at=10, checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=-1))
    ref, ref_rec = _run(tmp_path / "ref", "ref")
    t, rec = _run(tmp_path / "other", "b", resume=str(work / "checkpoints" / "iter_4.pth"))
    assert min(rec.loss) == 5
    _same(_final_state(t), _final_state(ref))
    # load_from: weights only, training starts at iteration 0 with those weights
    ckpt = load_file(work / "checkpoints" / "iter_8.pth")
    t2 = ct.build(
        str(tmp_path / "fresh"),
        experiment="c",
        resume=False,
        load_from=str(work / "checkpoints" / "iter_8.pth"),
        train_cfg=dict(by_epoch=True, max_epochs=1),
    )
    t2._build_train()
    t2._prepare()
    _same(t2.unwrapped_model.state_dict(), ckpt["model"])
    assert t2.progress.iteration == 0


def test_resume_true_without_checkpoint_falls_back_to_load_from(tmp_path: Path) -> None:
    src = ct.build(str(tmp_path / "src"), experiment="s")
    src.save_weights(tmp_path / "w.safetensors")
    t = ct.build(str(tmp_path / "empty"), experiment="e", resume=True, load_from=str(tmp_path / "w.safetensors"))
    torch.nn.init.zeros_(t.unwrapped_model.net[0].weight)
    t._build_train()
    t._prepare()
    _same(t.unwrapped_model.state_dict(), src.unwrapped_model.state_dict())


def test_resume_true_with_load_from_a_training_checkpoint_resumes_it_as_mmengine_does(tmp_path: Path) -> None:
    """mmengine's ``resume=True, load_from=PATH`` (what mmpretrain's ``--resume PATH`` writes into a config) resumes
    PATH in full."""
    work = tmp_path / "work"
    _run(work, "a", crash_at=10, checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=-1))
    ref, _ = _run(tmp_path / "ref", "ref")
    t, rec = _run(tmp_path / "other", "b", resume=True, load_from=str(work / "checkpoints" / "iter_8.pth"))
    assert min(rec.loss) == 9  # went on after iteration 8, optimizer, schedule and data order included
    _same(_final_state(t), _final_state(ref))
    assert str(t.checkpoints.restored[0]).endswith("iter_8.pth")  # type: ignore[index]
    # a checkpoint of its own wins (a restarted job goes on from where it stopped, not from load_from again)
    t2, rec2 = _run(tmp_path / "other", "c", resume=True, load_from=str(work / "checkpoints" / "iter_4.pth"))
    assert rec2.loss == {}  # other/ holds the finished run's checkpoints: nothing left to train
    assert t2.progress.iteration == ref.progress.iteration


def test_corrupt_latest_checkpoint_falls_back_with_warning(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _run(work, "a", crash_at=13, checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=-1))
    d = work / "checkpoints"
    assert read_latest(d) == "iter_12.pth"
    data = (d / "iter_12.pth").read_bytes()
    (d / "iter_12.pth").write_bytes(data[: len(data) // 2])  # truncated, as by a full disk
    ref, ref_rec = _run(tmp_path / "ref", "ref")
    with pytest.warns(UserWarning, match="iter_12.pth"):
        t, rec = _run(work, "b")
    assert min(rec.loss) == 9  # resumed from iter_8
    _same(_final_state(t), _final_state(ref))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_malicious_checkpoint_is_refused_without_side_effects(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    d = tmp_path / "work" / "checkpoints"
    d.mkdir(parents=True)
    with open(d / "iter_100.pth", "wb") as f:
        pickle.dump({"model": Evil(), "progress": {"epoch": 0, "iteration": 100, "iter_in_epoch": 0}}, f)
    for resume in (True, str(d / "iter_100.pth")):
        t = ct.build(str(tmp_path / "work"), experiment="x", resume=resume)
        before = {k: v.clone() for k, v in t.unwrapped_model.state_dict().items()}
        with pytest.raises(UnsafeCheckpointError, match="iter_100.pth"):
            t.train()
        assert not marker.exists(), "the pickle was executed"
        assert t.progress.iteration == 0
        _same(t.unwrapped_model.state_dict(), before)


def test_every_checkpoint_written_loads_with_weights_only(tmp_path: Path) -> None:
    _run(tmp_path / "w", "a", checkpoint=dict(interval=5, by_epoch=False, max_keep_ckpts=-1))
    files = sorted((tmp_path / "w" / "checkpoints").glob("*.pth"))
    assert len(files) >= 10 and any(f.name.startswith("best_") for f in files)
    for f in files:
        ckpt = torch.load(f, weights_only=True)  # raises if anything but tensors / plain containers
        assert {
            "model",
            "optim_wrapper",
            "param_schedulers",
            "progress",
            "train_dataloader",
            "rng",
            "hooks",
            "metric_store",
        } <= set(ckpt)


def test_numpy_values_in_state_are_saved_as_plain_numbers_and_other_objects_refused(tmp_path: Path) -> None:
    import numpy as np

    class NumpyState(Hook):
        def __init__(self, value: Any) -> None:
            self.value = value

        def state_dict(self) -> dict[str, Any]:
            return {"v": self.value}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.value = state["v"]

    t = ct.build(
        str(tmp_path / "a"), experiment="a", custom_hooks=[NumpyState({"s": np.float64(0.5), "a": np.arange(3)})]
    )
    t._build_train()
    t._prepare()
    path = t.checkpoints.save("x.pth")
    got = torch.load(path, weights_only=True)["hooks"]["NumpyState"]["v"]
    assert got["s"] == 0.5 and type(got["s"]) is float
    assert torch.equal(got["a"], torch.arange(3))

    t = ct.build(str(tmp_path / "b"), experiment="b", custom_hooks=[NumpyState(Path("somewhere"))])
    t._build_train()
    t._prepare()
    with pytest.raises(TypeError, match=r"checkpoint\['hooks'\]\['NumpyState'\]\['v'\].*weights_only"):
        t.checkpoints.save("y.pth")
    assert not (tmp_path / "b" / "checkpoints" / "y.pth").exists()


def test_mismatched_model_is_refused_before_anything_changes(tmp_path: Path) -> None:
    work = tmp_path / "w"
    _run(work, "a", crash_at=5, checkpoint=dict(interval=4, by_epoch=False))

    class Wider(ct.Net):
        def __init__(self) -> None:
            super().__init__()
            self.net[0] = torch.nn.Linear(16, 32)
            self.net[3] = torch.nn.Linear(32, 5)

    t = ct.build(str(work), experiment="b", model=Wider())
    before = {k: v.clone() for k, v in t.unwrapped_model.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"size mismatch for net\.3\.weight"):
        t.train()
    _same(t.unwrapped_model.state_dict(), before)
    assert t.progress.iteration == 0


def test_safetensors_export_roundtrip(tmp_path: Path) -> None:
    t, _ = _run(tmp_path / "w", "a", train_cfg=dict(by_epoch=True, max_epochs=1))
    path = t.save_weights(tmp_path / "model.safetensors")
    from safetensors.torch import load_file as st_load

    _same(dict(st_load(path)), dict(t.unwrapped_model.state_dict()))
    t2 = ct.build(str(tmp_path / "v"), experiment="b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no missing / unexpected keys
        t2.load_weights(path, strict=True)
    _same(t2.unwrapped_model.state_dict(), t.unwrapped_model.state_dict())


def test_stale_checkpoints_resume_list_order(tmp_path: Path) -> None:
    _run(tmp_path / "w", "a", crash_at=14, checkpoint=dict(interval=4, by_epoch=False, max_keep_ckpts=2))
    names = [p.name for p in list_checkpoints(tmp_path / "w" / "checkpoints")]
    assert names == ["iter_12.pth", "iter_8.pth"]
