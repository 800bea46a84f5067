"""CheckpointHook options with mmengine semantics: save_begin, filename_tmpl, several save_best keys, rules,
published_keys."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import chaos_train as ct  # 15 iterations per epoch, validation (val/acc) after every epoch
import pytest
import torch

import trainwright as tw
from trainwright.checkpoint import list_checkpoints, read_latest
from trainwright.hooks.checkpoint import CheckpointHook, infer_rule
from trainwright.hooks.hook import Hook


def _names(work: Path) -> set[str]:
    return {p.name for p in (work / "checkpoints").iterdir()}


class Scores(Hook):
    """Sets scripted validation metrics (the score is what the test controls), one value per validation."""

    priority = "HIGHEST"

    def __init__(self, **scripts: list[float]) -> None:
        self.scripts = scripts
        self.i = 0

    def after_val_epoch(self, trainer: tw.Trainer, metrics: dict[str, float] | None = None) -> None:
        assert metrics is not None
        for key, values in self.scripts.items():
            metrics[f"val/{key}"] = values[self.i]
        self.i += 1


# -- save_begin / filename_tmpl -------------------------------------------------------------


@pytest.mark.parametrize(
    ("interval", "save_begin", "expected"), [(2, 0, [2, 4]), (2, 1, [1, 3, 5]), (2, 3, [3, 5]), (3, 2, [2, 5])]
)
def test_save_begin_by_epoch(tmp_path: Path, interval: int, save_begin: int, expected: list[int]) -> None:
    """mmengine: saved at epochs e >= save_begin with (e - save_begin) % interval == 0."""
    t = ct.build(
        str(tmp_path),
        epochs=5,
        checkpoint=dict(
            interval=interval, save_begin=save_begin, by_epoch=True, save_last=False, save_best=None, max_keep_ckpts=-1
        ),
    )
    t.train()
    assert _names(tmp_path) == {f"epoch_{e}.pth" for e in expected} | {"latest"}


def test_save_begin_by_iteration(tmp_path: Path) -> None:
    t = ct.build(
        str(tmp_path),
        epochs=2,
        checkpoint=dict(interval=4, save_begin=3, by_epoch=False, save_last=False, save_best=None, max_keep_ckpts=-1),
    )
    t.train()
    assert _names(tmp_path) == {f"iter_{i}.pth" for i in (3, 7, 11, 15, 19, 23, 27)} | {"latest"}
    assert torch.load(tmp_path / "checkpoints" / "iter_7.pth", weights_only=True)["progress"]["iteration"] == 7


def test_filename_tmpl_names_periodic_and_best_files_and_resume_finds_them(tmp_path: Path) -> None:
    t = ct.build(
        str(tmp_path),
        epochs=2,
        checkpoint=dict(interval=1, by_epoch=True, filename_tmpl="model_e{}.pth", save_best="val/acc", max_keep_best=5),
    )
    t.train()
    names = _names(tmp_path)
    assert {"model_e1.pth", "model_e2.pth", "latest"} <= names
    assert {n for n in names if n.startswith("best_")} <= {"best_val_acc_model_e1.pth", "best_val_acc_model_e2.pth"}
    assert read_latest(tmp_path / "checkpoints") == "model_e2.pth"
    resumed = ct.build(
        str(tmp_path),
        epochs=3,
        experiment="b",
        checkpoint=dict(interval=1, by_epoch=True, filename_tmpl="model_e{}.pth", save_best=None),
    )
    resumed.train()
    assert "model_e3.pth" in _names(tmp_path)
    assert torch.load(tmp_path / "checkpoints" / "model_e3.pth", weights_only=True)["progress"]["iteration"] == 45


@pytest.mark.parametrize("tmpl", ["epoch.pth", "e_{}_{}.pth", "epoch_{}.pt", "best_{}.pth", "sub/e_{}.pth"])
def test_bad_filename_tmpl_is_refused(tmpl: str) -> None:
    with pytest.raises(ValueError, match="filename_tmpl"):
        CheckpointHook(filename_tmpl=tmpl)


# -- save_best: several keys, rules ---------------------------------------------------------


def test_several_save_best_keys_each_keep_their_best_files(tmp_path: Path) -> None:
    acc = [0.5, 0.9, 0.1, 0.95, 0.7]
    err = [0.4, 0.3, 0.6, 0.35, 0.2]
    t = ct.build(
        str(tmp_path),
        epochs=5,
        hooks=[Scores(acc=acc, err=err)],
        checkpoint=dict(
            interval=-1, save_last=False, save_best=["val/acc", "val/err"], rule=["greater", "less"], max_keep_best=2
        ),
    )
    t.train()
    best = {n for n in _names(tmp_path) if n.startswith("best_")}
    # acc: the two highest are epochs 4 (0.95) and 2 (0.9); err: the two lowest are epochs 5 (0.2) and 2 (0.3)
    assert best == {
        "best_val_acc_epoch_4.pth",
        "best_val_acc_epoch_2.pth",
        "best_val_err_epoch_5.pth",
        "best_val_err_epoch_2.pth",
    }
    hook = t.hooks.get(CheckpointHook)
    assert hook.best == {
        "val/acc": [(0.95, "best_val_acc_epoch_4.pth"), (0.9, "best_val_acc_epoch_2.pth")],
        "val/err": [(0.2, "best_val_err_epoch_5.pth"), (0.3, "best_val_err_epoch_2.pth")],
    }
    for name in best:
        n = int(name.split("_")[-1].split(".")[0])
        assert torch.load(tmp_path / "checkpoints" / name, weights_only=True)["progress"]["epoch"] == n


def test_rules_are_inferred_per_key_and_survive_resume(tmp_path: Path) -> None:
    """acc → greater, loss → less (mmengine's greater_keys / less_keys); a resumed run keeps ranking against the
    saved bests."""
    acc = [0.5, 0.9, 0.1, 0.95]
    loss = [0.4, 0.3, 0.6, 0.1]
    cfg = dict(interval=1, by_epoch=True, save_best=["val/acc", "val/loss"], max_keep_best=1)
    t = ct.build(str(tmp_path), epochs=2, hooks=[Scores(acc=acc[:2], loss=loss[:2])], checkpoint=cfg)
    t.train()
    assert {n for n in _names(tmp_path) if n.startswith("best_")} == {
        "best_val_acc_epoch_2.pth",
        "best_val_loss_epoch_2.pth",
    }
    r = ct.build(str(tmp_path), epochs=4, experiment="b", hooks=[Scores(acc=acc[2:], loss=loss[2:])], checkpoint=cfg)
    r.train()
    assert {n for n in _names(tmp_path) if n.startswith("best_")} == {
        "best_val_acc_epoch_4.pth",
        "best_val_loss_epoch_4.pth",
    }
    assert r.hooks.get(CheckpointHook).best == {
        "val/acc": [(0.95, "best_val_acc_epoch_4.pth")],
        "val/loss": [(0.1, "best_val_loss_epoch_4.pth")],
    }


def test_infer_rule_follows_mmengine_defaults() -> None:
    assert infer_rule("val/acc") == "greater"
    assert infer_rule("coco/bbox_mAP") == "greater"
    assert infer_rule("AR@100") == "greater"
    assert infer_rule("val/loss") == "less"
    assert infer_rule("val/mse", less_keys=["mse"]) == "less"
    with pytest.raises(ValueError, match="rule='greater' or rule='less'"):
        infer_rule("val/mse")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(save_best={"val/acc": "greater"}), TypeError, "save_best must be a str, a non-empty list"),
        (dict(save_best=("val/acc",)), TypeError, "save_best must be a str"),
        (dict(save_best=[]), TypeError, "save_best"),
        (dict(save_best=["val/acc", "val/acc"]), ValueError, "more than once"),
        (dict(save_best=["auto", "val/acc"]), ValueError, "'auto'"),
        (dict(save_best=["val/acc", "val/loss"], rule=["greater", "less", "less"]), ValueError, "3 rules"),
        (dict(save_best="val/acc", rule="bigger"), ValueError, "rule must be"),
        (dict(save_best="val/mse"), ValueError, "cannot tell whether a higher or a lower 'val/mse'"),
        (dict(published_keys={"model": 1}), TypeError, "published_keys"),
        (dict(save_begin=-1), ValueError, "save_begin"),
    ],
)
def test_invalid_options_are_refused_at_construction(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        CheckpointHook(**kwargs)


def test_unknown_key_is_named_with_the_metrics_at_the_first_validation(tmp_path: Path) -> None:
    t = ct.build(
        str(tmp_path), epochs=2, checkpoint=dict(interval=-1, save_last=False, save_best=["val/acc", "val/accuracy"])
    )
    with pytest.raises(
        KeyError, match=r"'val/accuracy' is not among the validation metrics \['val/acc'\]\. Did you mean 'val/acc'\?"
    ) as e:
        t.train()
    assert "save_best" in str(e.value)
    assert t.progress.epoch == 1  # the first validation
    assert not list(tmp_path.glob("checkpoints/best_*"))  # nothing used the keys before the check


def test_auto_is_the_first_metric_and_its_rule_is_inferred(tmp_path: Path) -> None:
    t = ct.build(
        str(tmp_path),
        epochs=3,
        hooks=[Scores(acc=[0.2, 0.8, 0.5])],
        checkpoint=dict(interval=-1, save_last=False, save_best="auto", max_keep_best=1),
    )
    t.train()
    assert {n for n in _names(tmp_path) if n.startswith("best_")} == {"best_val_acc_epoch_2.pth"}


def test_save_best_without_validation_says_so_at_start(tmp_path: Path) -> None:
    t = ct.build(
        str(tmp_path),
        epochs=1,
        val_dataloader=None,
        val_evaluator=None,
        checkpoint=dict(save_best="val/acc"),
        log_level="INFO",
    )
    t.train()
    log = (tmp_path / "run" / "train.log").read_text()
    assert "needs validation metrics, but the trainer has no val_dataloader: no best checkpoint will be written" in log
    assert not list(tmp_path.glob("checkpoints/best_*"))


def test_state_of_a_single_key_checkpoint_loads() -> None:
    hook = CheckpointHook(save_best="val/acc")
    hook.load_state_dict(
        {"kept": ["epoch_3.pth"], "best": [[0.7, "best_val_acc_epoch_3.pth", "val/acc"]], "last_saved_iter": 45}
    )
    assert hook.best == {"val/acc": [(0.7, "best_val_acc_epoch_3.pth")]}
    assert hook.best_score == 0.7 and hook.best_ckpt == "best_val_acc_epoch_3.pth"
    again = CheckpointHook(save_best="val/acc")
    again.load_state_dict(hook.state_dict())
    assert again.best == hook.best and again.kept == ["epoch_3.pth"]


# -- published_keys -------------------------------------------------------------------------


def test_published_files_are_stripped_and_named_by_the_hash_of_their_content(tmp_path: Path) -> None:
    t = ct.build(
        str(tmp_path),
        epochs=2,
        hooks=[Scores(acc=[0.9, 0.4])],
        checkpoint=dict(interval=1, by_epoch=True, save_best="val/acc", published_keys=["meta", "model"]),
    )
    t.train()
    d = tmp_path / "checkpoints"
    published = sorted(p for p in d.iterdir() if "-" in p.name)
    stems = sorted(p.name.rsplit("-", 1)[0] for p in published)
    assert stems == ["best_val_acc_epoch_1", "epoch_2"]  # the best and the last checkpoint
    for p in published:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        assert p.name == f"{p.name.rsplit('-', 1)[0]}-{digest[:8]}.pth"
        pub = torch.load(p, weights_only=True)
        src = torch.load(d / f"{p.name.rsplit('-', 1)[0]}.pth", weights_only=True)
        assert set(pub) == {"meta", "model"}
        assert pub["meta"] == src["meta"]
        assert all(torch.equal(pub["model"][k], v) for k, v in src["model"].items())
    assert not any("-" in p.name for p in list_checkpoints(d))  # never a resume point
    assert read_latest(d) == "epoch_2.pth"


def test_published_keys_under_a_strategy_whose_checkpoints_cannot_be_read_whole_is_refused_at_start(
    tmp_path: Path,
) -> None:
    """DeepSpeed's folders are read by its engine on every rank: publishing (rank 0 alone) cannot read them; said
    before training, with the alternative."""
    from trainwright.strategies.single_device import SingleDeviceStrategy

    class EngineFolders(
        SingleDeviceStrategy
    ):  # the one property DeepSpeedStrategy sets (deepspeed is not installed here)
        name = "engine"
        readable_whole = False

    t = ct.build(
        str(tmp_path), epochs=1, strategy=EngineFolders("cpu"), checkpoint=dict(published_keys=["meta", "model"])
    )
    with pytest.raises(
        ValueError,
        match=r"published_keys=\['meta', 'model'\] cannot publish under strategy='engine'.*trainer.save_weights",
    ):
        t.train()
    assert t.progress.iteration == 0
    t.close()


def test_published_keys_must_name_checkpoint_entries(tmp_path: Path) -> None:
    t = ct.build(str(tmp_path), epochs=1, checkpoint=dict(published_keys=["meta", "state_dict"]))
    with pytest.raises(
        ValueError, match="'state_dict' is not a key of this trainer's checkpoints.*trainwright's 'model'"
    ):
        t.train()
    assert t.progress.iteration == 0
