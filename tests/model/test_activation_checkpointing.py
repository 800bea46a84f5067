"""Activation checkpointing: the same training with fewer tensors saved for backward, under single, DDP and FSDP.

Runs with and without ``activation_checkpointing=["Block"]`` train a 3-block model 3 SGD
steps from the same weights and data; they must end with the same parameters (tolerance
1e-6; the recomputed forward is the same arithmetic, measured bitwise equal on CPU) while
autograd saves fewer tensors in each iteration (counted with
``torch.autograd.graph.saved_tensors_hooks``). DDP and FSDP run in one torchrun launch of 2
gloo processes (ac_train.py).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
from ac_train import SCRIPT_RUNS, Block, Net, data, run
from launch import launch

import trainwright as tw
from trainwright.model.activation_checkpointing import (
    apply_activation_checkpointing,
    is_checkpointed,
    remove_activation_checkpointing,
)

SCRIPT = Path(__file__).with_name("ac_train.py")
ATOL = 1e-6


def _load(out: Path, name: str, rank: int = 0) -> dict:
    return torch.load(out / name / f"result_rank{rank}.pt", weights_only=True)


def _assert_same_training_fewer_saved(plain: dict, ac: dict) -> None:
    assert plain["keys"] == ac["keys"]  # the state-dict keys do not change
    assert ac["losses"] == pytest.approx(plain["losses"], abs=ATOL)
    for k, v in plain["params"].items():
        torch.testing.assert_close(ac["params"][k], v, atol=ATOL, rtol=0, msg=k)
    assert len(ac["counts"]) == len(plain["counts"]) == 3
    for with_ac, without in zip(ac["counts"], plain["counts"]):
        assert 0 < with_ac < without, (ac["counts"], plain["counts"])


def test_single_process_same_parameters_and_fewer_saved_tensors(tmp_path: Path) -> None:
    run(tmp_path, "plain:single:0")
    run(tmp_path, "ac:single:1")
    plain, ac = _load(tmp_path, "plain"), _load(tmp_path, "ac")
    _assert_same_training_fewer_saved(plain, ac)
    # 3 blocks x (ln, fc1, gelu, fc2 ...) recomputed: most of the saved tensors are gone
    assert ac["counts"][0] <= plain["counts"][0] // 2, (ac["counts"], plain["counts"])
    assert ac["config"] == ["Block"] and plain["config"] is None


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ddp_and_fsdp_same_parameters_and_fewer_saved_tensors(tmp_path: Path) -> None:
    launch(SCRIPT, [str(tmp_path), *SCRIPT_RUNS], tmp_path, nproc=2, timeout=300)
    for strategy in ("ddp", "fsdp"):
        for rank in (0, 1):
            plain, ac = _load(tmp_path, f"{strategy}_plain", rank), _load(tmp_path, f"{strategy}_ac", rank)
            assert ac["losses"] == pytest.approx(plain["losses"], abs=ATOL), strategy
            assert all(0 < a < p for a, p in zip(ac["counts"], plain["counts"])), (
                strategy,
                ac["counts"],
                plain["counts"],
            )
        _assert_same_training_fewer_saved(_load(tmp_path, f"{strategy}_plain"), _load(tmp_path, f"{strategy}_ac"))


def _trainer(work_dir: Path, ac: bool | list[str], iters: int, resume: bool = False, save: int = -1) -> tw.Trainer:
    tw.seed_everything(0)
    return tw.Trainer(
        model=Net(),
        work_dir=work_dir,
        train_dataloader=dict(dataset=data(), batch_size=8, shuffle=True),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        default_hooks=dict(checkpoint=dict(by_epoch=False, interval=save)),
        activation_checkpointing=ac if isinstance(ac, list) else (["Block"] if ac else None),
        resume=resume,
        randomness=dict(seed=0),
        log_level="WARNING",
    )


@pytest.mark.parametrize("saved_with_ac", [True, False], ids=["ac_to_plain", "plain_to_ac"])
def test_checkpoints_are_interchangeable_with_and_without_checkpointing(tmp_path: Path, saved_with_ac: bool) -> None:
    whole = _trainer(tmp_path / "whole", ac=False, iters=6)
    whole.train()
    first = _trainer(tmp_path / "split", ac=saved_with_ac, iters=3, save=3)
    first.train()
    first.close()
    second = _trainer(tmp_path / "split", ac=not saved_with_ac, iters=6, resume=True)
    second.train()
    assert second.progress.iteration == 6
    for (k, a), b in zip(whole.unwrapped_model.state_dict().items(), second.unwrapped_model.state_dict().values()):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0, msg=k)
    whole.close()
    second.close()


def test_matches_class_names_types_and_module_paths_outermost_only() -> None:
    model = Net()
    assert len(apply_activation_checkpointing(copy.deepcopy(model), [Block])) == 3
    chosen = apply_activation_checkpointing(model, ["blocks.1", "Linear", "Block"])
    # the blocks (and the Linear layers outside them), not the Linear layers inside a checkpointed block
    assert chosen == [model.inp, *model.blocks, model.out]
    assert all(is_checkpointed(m) for m in chosen) and not is_checkpointed(model.blocks[0].fc1)
    copied = copy.deepcopy(model)  # EMA copies the model: the copy checkpoints its own blocks
    assert is_checkpointed(copied.blocks[0]) and copied.blocks[0].forward.__self__ is copied.blocks[0]


def test_a_name_that_matches_nothing_is_an_error_naming_the_model_classes(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, ac=["Blok"], iters=1)
    with pytest.raises(
        ValueError,
        match=r"activation_checkpointing: 'Blok' matches no module of Net; name one of its module classes "
        r"\[.*'Block'.*'Linear'",
    ):
        trainer.train()
    trainer.close()


def test_config_key_builds_and_is_recorded(tmp_path: Path) -> None:
    cfg = dict(
        model=Net(),
        work_dir=str(tmp_path),
        train_dataloader=dict(dataset=data(), batch_size=8),
        activation_checkpointing=["Block"],
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=1),
        log_level="WARNING",
        default_hooks=dict(checkpoint=None),
    )
    trainer = tw.Trainer.from_config(cfg)
    trainer.train()
    assert trainer.config["activation_checkpointing"] == ["Block"]
    assert all(is_checkpointed(b) for b in trainer.unwrapped_model.blocks)
    trainer.close()


def test_without_gradients_the_plain_forward_runs() -> None:
    model = Net()
    ref = copy.deepcopy(model)
    apply_activation_checkpointing(model, ["Block"])
    x = torch.randn(2, 4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(model(x), ref(x), atol=0, rtol=0)
    remove_activation_checkpointing(model)
    assert not any(is_checkpointed(m) for m in model.modules())
