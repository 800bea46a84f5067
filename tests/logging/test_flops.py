"""tflops and mfu in the training records: FLOPs counted once, on the first iteration, compared with the analytic
counts."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import RecordLosses, regression_set, train_records
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import register_flop_formula

import trainwright as tw
from trainwright.logging.flops import matmul_precision, peak_tflops

# -- a probe: an op whose FLOP formula notes every time torch's counter counts it -------------

PROBE_COUNTS: list[int] = []


@torch.library.custom_op("trainwright_test::flops_probe", mutates_args=())
def flops_probe(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@flops_probe.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@register_flop_formula(torch.ops.trainwright_test.flops_probe)
def _probe_flops(x_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    PROBE_COUNTS.append(1)  # runs only while a FlopCounterMode is active
    return 0


# -- models -------------------------------------------------------------------------------------


class Linears(tw.BaseModel):
    """Linear layers only; each forward also calls the probe (counted 0 FLOPs)."""

    def __init__(self, d_in: int = 4, width: int = 256, depth: int = 3) -> None:
        super().__init__()
        dims = [d_in] + [width] * depth + [1]
        self.layers = nn.Sequential(*(nn.Linear(a, b) for a, b in zip(dims, dims[1:])))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        flops_probe(x.detach())
        out = self.layers(x)
        return {"loss": F.mse_loss(out, y)} if mode == "loss" else out


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(tw.BaseModel):
    """A GPT: token + position embeddings, pre-norm blocks, an untied head; batches are ``(ids, targets)``."""

    def __init__(self, vocab: int = 64, d: int = 128, layers: int = 2, heads: int = 4, seq: int = 16) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        logits = self.head(self.ln(self.blocks(x)))
        return {"loss": F.cross_entropy(logits.flatten(0, 1), targets.flatten())} if mode == "loss" else logits

    def count_tokens(self, data_batch: Any) -> int:
        return data_batch[0].numel()


def _linear_trainer(trainer_factory: Any, n: int = 64, batch: int = 16, **kw: Any) -> tw.Trainer:
    kw.setdefault(
        "default_hooks", dict(checkpoint=None, logger=dict(interval=2, flush_secs=0), flops=dict(peak_tflops=0.5))
    )
    kw.setdefault("log_level", "INFO")
    return trainer_factory(model=Linears(), dataset=regression_set(n), batch_size=batch, **kw)


# -- the numbers ----------------------------------------------------------------------------------


def test_linear_tflops_is_6_params_samples_over_time_and_mfu_is_over_the_given_peak(trainer_factory: Any) -> None:
    """The issue's check: tflops = 6 · parameters · samples / time (time: the record's own) within 2 %."""
    t = _linear_trainer(
        trainer_factory, n=72, train_cfg=dict(by_epoch=True, max_epochs=2)
    )  # 16, 16, 16, 16, 8 samples per epoch
    t.train()
    model = t.unwrapped_model
    params = sum(p.numel() for p in model.parameters())
    first = model.layers[0]
    recs = train_records(t.run_dir)
    assert [r["iter"] for r in recs] == [2, 4, 5, 7, 9, 10]  # the interval counted within each epoch of 5
    for r in recs:
        samples = 8 if r["iter"] in (5, 10) else 16  # each epoch's last batch is short: it counts as itself
        assert r["tflops"] == pytest.approx(6 * params * samples / r["time"] / 1e12, rel=0.02)
        # Exactly: 2 FLOPs per weight and sample forward, 4 backward, less the first layer's input gradient (its input
        # needs none).
        exact = 6 * sum(m.weight.numel() for m in model.layers) * samples - 2 * first.weight.numel() * samples
        assert r["tflops"] * r["time"] * 1e12 == pytest.approx(exact, rel=1e-9)
        assert r["mfu"] == pytest.approx(r["tflops"] / 0.5, rel=1e-12)


def test_transformer_count_matches_6_params_tokens(trainer_factory: Any) -> None:
    """A GPT's counted FLOPs: 6 · non-embedding parameters · tokens within 3 %; exactly, the matmul weights' 6 · W · T
    plus attention.

    Attention as torch counts it (its CUDA kernels' formulas, which this CPU's fused kernel is
    given too): the full score matrix's two matmuls forward (4 · S · d per token and layer,
    causal or not) and five backward (10 · S · d): 14 · layers · S · d per token. Here that is
    2 % of the total, the parameters not in matmuls (biases, norms) 0.8 %.
    """
    vocab, d, layers, seq, batch = 64, 128, 2, 16, 8
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (64, seq + 1), generator=g)
    data = TensorDataset(ids[:, :-1], ids[:, 1:])
    t = trainer_factory(
        model=TinyGPT(vocab, d, layers, 4, seq),
        train_dataloader=DataLoader(data, batch_size=batch),
        log_level="INFO",
        default_hooks=dict(checkpoint=None, logger=dict(interval=4, flush_secs=0)),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)),
    )
    t.train()
    model = t.unwrapped_model
    tokens = batch * seq
    non_embedding = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("tok.", "pos.")))
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    counted = t.log_lines.flops.flops
    assert counted == 6 * matmul_weights * tokens + 14 * layers * seq * d * tokens
    assert counted == pytest.approx(6 * non_embedding * tokens, rel=0.03)
    recs = train_records(t.run_dir)
    assert [r["iter"] for r in recs] == [4, 8]
    for r in recs:
        assert r["tflops"] == pytest.approx(counted / r["time"] / 1e12, rel=1e-9)
        assert r["tokens_per_s"] == pytest.approx(tokens / r["time"], rel=1e-9)  # the model's count_tokens
        assert "mfu" not in r  # no peak on a CPU unless given


def test_the_examples_char_gpt_counts_as_the_formula_says(trainer_factory: Any) -> None:
    """examples/char_gpt.py's CharGPT (imported, not copied): the same count, 6 · W · T + attention, within 3 % of 6
    · P · T."""
    spec = importlib.util.spec_from_file_location(
        "char_gpt_for_flops", Path(__file__).resolve().parents[2] / "examples" / "char_gpt.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = (
        example  # so the registry sees the example's classes as the file's (a config run of it registered them already)
    )
    spec.loader.exec_module(example)
    d, layers, seq, batch = 128, 2, 16, 4
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 96, (8, seq + 1), generator=g)
    t = trainer_factory(
        model=example.CharGPT(block_size=seq, dim=d, depth=layers, heads=4),
        train_dataloader=DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=batch),
    )
    t.train()
    model, tokens = t.unwrapped_model, batch * seq
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    non_embedding = sum(p.numel() for n, p in model.named_parameters() if n not in ("tok.weight", "pos"))
    assert t.log_lines.flops.flops == 6 * matmul_weights * tokens + 14 * layers * seq * d * tokens
    assert t.log_lines.flops.flops == pytest.approx(6 * non_embedding * tokens, rel=0.03)


def test_gradient_accumulation_counts_one_micro_batch(trainer_factory: Any) -> None:
    """An iteration is one forward and backward: with accumulation the count is the same as without."""
    counts = []
    for accumulate in (1, 2):
        t = _linear_trainer(
            trainer_factory, optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01), accumulative_counts=accumulate)
        )
        t.train()
        counts.append(t.log_lines.flops.flops)
        for r in train_records(t.run_dir):
            assert r["tflops"] * r["time"] * 1e12 == pytest.approx(counts[-1], rel=1e-9)
    assert counts[0] == counts[1] > 0


# -- when, and what it changes --------------------------------------------------------------------


def test_counted_once_per_train_at_its_first_iteration(trainer_factory: Any, tmp_path: Path) -> None:
    """The counter is active around one iteration only (the probe's formula runs once), again after a resume."""
    PROBE_COUNTS.clear()
    hooks = dict(checkpoint=dict(interval=5, by_epoch=False), logger=dict(interval=2))
    t = _linear_trainer(
        trainer_factory, work_dir=tmp_path / "a", default_hooks=hooks, train_cfg=dict(by_epoch=True, max_epochs=3)
    )  # 12 iterations
    t.train()
    assert len(PROBE_COUNTS) == 1
    assert all("tflops" in r for r in train_records(t.run_dir))
    PROBE_COUNTS.clear()
    resumed = _linear_trainer(
        trainer_factory,
        work_dir=tmp_path / "a",
        default_hooks=hooks,
        train_cfg=dict(by_epoch=True, max_epochs=4),
        resume=True,
        experiment_name="b",
    )
    resumed.train()  # from the last checkpoint, 4 more iterations
    assert len(PROBE_COUNTS) == 1
    assert all("tflops" in r for r in train_records(resumed.run_dir))


def test_counting_changes_no_number(trainer_factory: Any, tmp_path: Path) -> None:
    """The same losses, bit for bit, with the flops hook and without it (dropout: the RNG is untouched too)."""

    class Dropped(Linears):
        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor") -> Any:
            return super().forward(F.dropout(x, 0.3, self.training), y, mode)

    losses = []
    for flops in (dict(), None):
        ref = RecordLosses()
        torch.manual_seed(0)  # the same initial weights
        t = trainer_factory(
            model=Dropped(),
            dataset=regression_set(48),
            batch_size=8,
            work_dir=tmp_path / str(flops),
            custom_hooks=[ref],
            default_hooks=dict(checkpoint=None, flops=flops),
            optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-2)),
            train_cfg=dict(by_epoch=True, max_epochs=2),
        )
        t.train()
        losses.append(ref.losses)
        assert ("tflops" in train_records(t.run_dir)[-1]) == (flops is not None)
    assert losses[0] == losses[1]


# -- peaks ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("log_level", ["INFO", "DEBUG"])
def test_no_peak_no_mfu_and_one_debug_message_on_cpu(trainer_factory: Any, log_level: str) -> None:
    """A CPU has no peak in the table: records carry tflops without mfu; the reason is said once, at DEBUG (not on
    every CPU run)."""
    t = _linear_trainer(
        trainer_factory,
        default_hooks=dict(checkpoint=None, logger=dict(interval=1)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        log_level=log_level,
    )
    t.train()
    recs = train_records(t.run_dir)
    assert len(recs) == 8
    assert all(r["tflops"] > 0 and "mfu" not in r for r in recs)
    log = (t.run_dir / "train.log").read_text()
    assert log.count("is not in trainwright.logging.flops.PEAKS") == (log_level == "DEBUG")
    if log_level == "DEBUG":
        assert "peak TFLOP/s of 'cpu' at fp32" in log and "default_hooks=dict(flops=dict(peak_tflops=...))" in log


@pytest.mark.parametrize(
    ("name", "precision", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),  # the SXM card's name
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H100 NVL", "fp16", 835.5),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA H200 NVL", "tf32", 417.5),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA A100 80GB PCIe", "bf16", 312.0),
        ("NVIDIA A10G", "bf16", 125.0),
        ("NVIDIA L4", "fp32", 30.3),
        ("NVIDIA L40S", "bf16", 362.1),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0),
        ("Tesla V100-PCIE-32GB", "tf32", 14.0),  # no TF32 tensor cores: float32 matmuls at the fp32 rate
        ("Tesla V100-SXM2-16GB", "bf16", None),  # no bf16 tensor cores: no peak, no mfu
        ("NVIDIA GeForce GTX 1080", "fp32", None),
        ("NVIDIA H100 80GB HBM3", "fp64", None),
    ],
)
def test_peak_table_lookup(name: str, precision: str, peak: float | None) -> None:
    assert peak_tflops(name, precision) == peak


def test_matmul_precision_follows_autocast_then_parameters_then_tf32_setting() -> None:
    assert matmul_precision(torch.bfloat16, torch.float32) == "bf16"
    assert matmul_precision(torch.float16, torch.float32) == "fp16"
    assert matmul_precision(None, torch.bfloat16) == "bf16"
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert matmul_precision(None, torch.float32) == "fp32"
        torch.set_float32_matmul_precision("high")
        assert matmul_precision(None, torch.float32) == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_peak_tflops_must_be_a_positive_number(trainer_factory: Any) -> None:
    for bad in (0, -1.0, "989", True, math.nan):
        with pytest.raises(ValueError, match="peak_tflops must be a number > 0"):
            trainer_factory(default_hooks=dict(flops=dict(peak_tflops=bad)))


# -- compiled models ------------------------------------------------------------------------------


class RecordingBackend:
    """A torch.compile backend that notes each graph it is given and runs it as traced (no code generation)."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.graphs += 1
        return gm.forward


def _compiled_trainer(trainer_factory: Any, work_dir: Path, backend: Any, **kw: Any) -> tw.Trainer:
    kw.setdefault(
        "default_hooks",
        dict(checkpoint=dict(interval=1), logger=dict(interval=2, flush_secs=0), flops=dict(peak_tflops=1.0)),
    )
    return trainer_factory(
        work_dir=work_dir,
        model=Linears(),
        dataset=regression_set(16),
        batch_size=4,
        compile=dict(backend=backend),
        log_level="INFO",
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.002, momentum=0.9), compile=dict(backend=backend)),
        **kw,
    )


def test_a_compiled_run_counts_its_first_iteration_eagerly_then_compiles(
    trainer_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counted iteration runs eagerly (dynamo would give up on code first run under the counter); the next ones
    are compiled."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    PROBE_COUNTS.clear()
    backend = RecordingBackend()
    t = _compiled_trainer(trainer_factory, tmp_path / "a", backend, train_cfg=dict(by_epoch=True, max_epochs=2))
    t.train()
    assert len(PROBE_COUNTS) == 1  # counted once, eagerly (the probe runs inside the model's forward)
    assert backend.graphs >= 2  # the model and the optimizer step were compiled after it
    params = sum(p.numel() for p in t.unwrapped_model.parameters())
    recs = train_records(t.run_dir)
    assert recs and all(
        r["tflops"] == pytest.approx(6 * params * 4 / r["time"] / 1e12, rel=0.02)
        and r["mfu"] == pytest.approx(r["tflops"])
        for r in recs
    )
    assert "records carry no tflops" not in (t.run_dir / "train.log").read_text()
    t.train()  # a second train() of the same run reuses the count: no eager iteration
    assert len(PROBE_COUNTS) == 1


def test_a_resumed_compiled_run_reuses_the_checkpoints_count_and_equals_the_uninterrupted_run(
    trainer_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    PROBE_COUNTS.clear()
    full = _compiled_trainer(
        trainer_factory, tmp_path / "full", RecordingBackend(), train_cfg=dict(by_epoch=True, max_epochs=2)
    )
    full.train()
    assert len(PROBE_COUNTS) == 1
    resumed = _compiled_trainer(
        trainer_factory,
        tmp_path / "resumed",
        RecordingBackend(),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        resume=str(full.ckpt_dir / "epoch_1.pth"),
    )
    resumed.train()
    assert len(PROBE_COUNTS) == 1  # not counted again: the count came with the checkpoint
    assert [r["tflops"] for r in train_records(resumed.run_dir)][-1] > 0
    for a, b in zip(full.unwrapped_model.parameters(), resumed.unwrapped_model.parameters()):
        assert torch.equal(a, b)
    # a checkpoint without a count (written with the hook off): no eager iteration, no tflops, and the log says why
    off = _compiled_trainer(
        trainer_factory,
        tmp_path / "off",
        RecordingBackend(),
        train_cfg=dict(by_epoch=True, max_epochs=1),
        default_hooks=dict(checkpoint=dict(interval=1), flops=None),
    )
    off.train()
    later = _compiled_trainer(
        trainer_factory,
        tmp_path / "later",
        RecordingBackend(),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        resume=str(off.ckpt_dir / "epoch_1.pth"),
    )
    later.train()
    assert len(PROBE_COUNTS) == 1
    assert all("tflops" not in r for r in train_records(later.run_dir))
    assert "the checkpoint it resumed from holds no FLOP count" in (later.run_dir / "train.log").read_text()
