"""Trainer(precision=...) end to end: autocast scope, loss scale in metrics.jsonl, scaler
resume through a checkpoint, conflicts, and the digits demo's accuracy bar in every precision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.model.data_preprocessor import BaseDataPreprocessor

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class RecordingPreprocessor(BaseDataPreprocessor):
    """Records whether autocast is on while the batch is preprocessed."""

    def __init__(self, log: dict[str, list]) -> None:
        super().__init__()
        self.log = log

    def forward(self, data: Any, training: bool = False) -> Any:  # noqa: D102
        out = super().forward(data, training)
        if training:  # val/test autocast wraps the whole val_step (mmengine's ValLoop does the same)
            self.log["preprocess"].append(torch.is_autocast_enabled("cpu"))
            self.log["preprocess_dtype"].append(out[0].dtype)
        return out


class TinyNet(tw.BaseModel):
    """6 → 16 → 3 MLP that records the autocast state of forward and backward."""

    def __init__(self, log: dict[str, list] | None = None) -> None:
        self.log = (
            log
            if log is not None
            else {"preprocess": [], "preprocess_dtype": [], "forward": [], "backward": [], "predict": []}
        )
        super().__init__(RecordingPreprocessor(self.log))
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:  # noqa: D102
        logits = self.net(x)
        if mode == "loss":
            self.log["forward"].append(torch.is_autocast_enabled("cpu"))
            loss = F.cross_entropy(logits, y)
            loss.register_hook(lambda g: self.log["backward"].append(torch.is_autocast_enabled("cpu")))
            return {"loss": loss}
        self.log["predict"].append(torch.is_autocast_enabled("cpu"))
        return logits


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g))


def _trainer(
    tmp: Path, precision: str = "32", max_iters: int = 4, model: TinyNet | None = None, **kw: Any
) -> tw.Trainer:
    kw.setdefault("optim_wrapper", dict(optimizer=dict(type="SGD", lr=0.1), clip_grad=dict(max_norm=1.0)))
    kw.setdefault("default_hooks", dict(logger=dict(interval=1), checkpoint=dict(interval=2, by_epoch=False)))
    return tw.Trainer(
        model=model or TinyNet(),
        work_dir=tmp,
        train_dataloader=DataLoader(_data(), batch_size=8, shuffle=True),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        precision=precision,
        randomness=dict(seed=0),
        log_level="WARNING",
        **kw,
    )


@pytest.mark.filterwarnings(
    "ignore:val\\(\\) ran over the val_dataloader without a val_evaluator:UserWarning"
)  # on purpose: no metric here
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_autocast_covers_preprocessor_forward_and_loss_not_backward(tmp_path: Path, precision: str) -> None:
    val = DataLoader(_data(), batch_size=16)
    trainer = _trainer(
        tmp_path,
        precision,
        max_iters=2,
        val_dataloader=val,
        val_cfg=dict(autocast=True),
        default_hooks=dict(checkpoint=None),
    )
    trainer.train()
    log = trainer.model.log
    assert log["preprocess"] == [True, True]  # inside optim_context, as mmengine's train_step
    assert log["preprocess_dtype"] == [torch.float32] * 2  # elementwise work stays float32 under autocast
    assert log["forward"] == [True, True]
    assert log["backward"] == [False, False]
    assert trainer.precision is trainer.optim_wrapper.precision  # one object for wrapper and loops
    trainer.val()
    assert log["predict"] and all(log["predict"])


@pytest.mark.filterwarnings(
    "ignore:val\\(\\) ran over the val_dataloader without a val_evaluator:UserWarning"
)  # on purpose: no metric here
def test_val_without_autocast_cfg_runs_in_fp32(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "bf16-mixed", val_dataloader=DataLoader(_data(), batch_size=16))
    trainer.val()
    assert trainer.model.log["predict"] == [False, False]


def test_fp16_logs_loss_scale_and_bf16_does_not(tmp_path: Path) -> None:
    for precision in ("16-mixed", "bf16-mixed", "32"):
        trainer = _trainer(
            tmp_path / precision,
            precision,
            default_hooks=dict(checkpoint=None, logger=dict(interval=1)),
            experiment_name="run",
        )
        trainer.train()
        trainer.close()
        records = [
            json.loads(line) for line in (tmp_path / precision / "run" / "metrics.jsonl").read_text().splitlines()
        ]
        train = [r for r in records if r["mode"] == "train"]
        assert len(train) == 4
        if precision == "16-mixed":
            assert all(r["loss_scale"] == 65536.0 for r in train)
        else:
            assert not any("loss_scale" in r for r in train)


class ScalerProbe(tw.Hook):
    """Captures the GradScaler state right after a checkpoint is loaded."""

    def __init__(self) -> None:
        self.loaded: dict | None = None

    def after_load_checkpoint(self, trainer: tw.Trainer, checkpoint: dict) -> None:  # noqa: D102
        self.loaded = dict(trainer.optim_wrapper.precision.scaler.state_dict())


def test_scaler_state_resumes_from_a_checkpoint_and_training_matches(tmp_path: Path) -> None:
    amp = dict(
        type="AmpOptimWrapper",
        dtype="float16",
        loss_scale=dict(init_scale=2.0**8, growth_interval=3),
        optimizer=dict(type="SGD", lr=0.1),
        clip_grad=dict(max_norm=1.0),
    )
    full = _trainer(tmp_path / "full", max_iters=8, optim_wrapper=dict(amp))
    full.train()

    first = _trainer(tmp_path / "run", max_iters=4, optim_wrapper=dict(amp))
    first.train()
    saved = first.optim_wrapper.precision.scaler.state_dict()
    assert (saved["scale"], saved["_growth_tracker"]) == (2.0**9, 1)  # 4 clean steps, interval 3
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "iter_4.pth", weights_only=True)
    assert ckpt["optim_wrapper"]["precision"]["scaler"] == saved

    probe = ScalerProbe()
    resumed = _trainer(tmp_path / "run", max_iters=8, optim_wrapper=dict(amp), resume=True, custom_hooks=[probe])
    resumed.train()
    assert probe.loaded is not None
    assert probe.loaded["scale"] == saved["scale"] and probe.loaded["_growth_tracker"] == saved["_growth_tracker"]
    end, ref = resumed.optim_wrapper.precision.scaler, full.optim_wrapper.precision.scaler
    assert (end.get_scale(), end._get_growth_tracker()) == (ref.get_scale(), ref._get_growth_tracker())
    for a, b in zip(resumed.unwrapped_model.parameters(), full.unwrapped_model.parameters()):
        assert torch.equal(a, b)


def test_trainer_precision_conflicting_with_amp_wrapper_is_an_error(tmp_path: Path) -> None:
    bad = dict(type="AmpOptimWrapper", dtype="float16", optimizer=dict(type="SGD", lr=0.1))
    with pytest.raises(ValueError, match="Conflicting mixed precision"):
        _trainer(tmp_path, "bf16-mixed", optim_wrapper=bad).train()


@pytest.mark.filterwarnings(
    "ignore:val\\(\\) ran over the val_dataloader without a val_evaluator:UserWarning"
)  # on purpose: no metric here
def test_amp_wrapper_with_default_trainer_precision_drives_the_loops(tmp_path: Path) -> None:
    amp = dict(type="AmpOptimWrapper", dtype="bfloat16", optimizer=dict(type="SGD", lr=0.1))
    trainer = _trainer(
        tmp_path,
        optim_wrapper=amp,
        val_dataloader=DataLoader(_data(), batch_size=16),
        val_cfg=dict(autocast=True),
        default_hooks=dict(checkpoint=None),
    )
    trainer.train()
    assert trainer.precision is trainer.optim_wrapper.precision and trainer.precision.dtype == torch.bfloat16
    trainer.val()
    assert all(trainer.model.log["predict"])


def _digits_trainer(work_dir: str, epochs: int, precision: str) -> Any:
    from trainwright.config import Config

    cfg = Config.fromfile(EXAMPLES / "digits.py")
    cfg.merge_from_dict({"train_cfg.max_epochs": epochs, "param_scheduler.1.end": epochs})
    return tw.Trainer.from_config(cfg, work_dir=work_dir, precision=precision, log_level="WARNING")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "16-mixed"])
def test_digits_reaches_the_accuracy_bar_in_every_precision(tmp_path: Path, precision: str) -> None:
    pytest.importorskip("sklearn")
    trainer = _digits_trainer(str(tmp_path), epochs=6, precision=precision)
    trainer.train()
    acc = trainer.val()["val/acc"]
    assert trainer.precision.name == precision
    assert acc >= 0.95, f"{precision}: val acc {acc:.4f} below the fp32 bar 0.95"
