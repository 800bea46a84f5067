"""Losses that carry their count: masked-token accumulation equals the concatenated batch (1 and 2 gloo processes);
mean losses unchanged."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from launch import gloo_group, use_gloo_env
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainwright as tw
from trainwright.optim import OptimWrapper

VOCAB, DIM, CTX = 32, 16, 12
LR, MAX_NORM = 1e-2, 0.3
UPDATES = 6


class TinyGPT(tw.BaseModel):
    """Embeddings → one causal self-attention block → LayerNorm → vocabulary head; next-token cross-entropy with labels
    masked by -100.

    ``counted=True`` reports the loss as a sum over the unmasked tokens with their number
    (``dict(loss=sum, num_items=n)``); ``counted=False`` as their mean (the usual contract).
    The attention has no bias: the key bias gets a gradient that is 0 up to rounding, which
    Adam turns into lr-sized steps of random sign (float noise, not what is tested here).
    """

    def __init__(self, counted: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.counted = counted
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(CTX, DIM)
        self.attn = nn.MultiheadAttention(DIM, 2, batch_first=True, bias=False)
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.register_buffer("causal", torch.triu(torch.ones(CTX, CTX, dtype=torch.bool), 1))

    def forward(self, ids: torch.Tensor, labels: torch.Tensor | None = None, mode: str = "tensor") -> Any:
        h = self.tok(ids) + self.pos.weight
        h = h + self.attn(h, h, h, attn_mask=self.causal, need_weights=False)[0]
        logits = self.head(self.ln(h))
        if mode != "loss":
            return logits
        assert labels is not None
        if not self.counted:
            return {"loss": F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)}
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        return {"loss": loss, "num_items": (labels != -100).sum()}


def token_set(n: int = 16 * UPDATES) -> TensorDataset:
    """Random token sequences with a masked tail; even samples keep 8-12 tokens, odd ones 1-3 (so the two ranks'
    counts differ)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (n, CTX), generator=g)
    labels = ids.roll(-1, 1).clone()
    keep = torch.where(
        torch.arange(n) % 2 == 0, torch.randint(8, CTX + 1, (n,), generator=g), torch.randint(1, 4, (n,), generator=g)
    )
    labels[torch.arange(CTX) >= keep[:, None]] = -100
    return TensorDataset(ids, labels)


def reference_big_batch(updates: int = UPDATES, batch: int = 16) -> tuple[TinyGPT, int]:
    """A hand-written loop: one AdamW step per concatenated batch of ``batch`` sequences on the per-token mean,
    clipped; how many steps clipped."""
    model = TinyGPT(counted=True)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    ids, labels = token_set().tensors
    clipped = 0
    for u in range(updates):
        out = model(ids[u * batch : (u + 1) * batch], labels[u * batch : (u + 1) * batch], mode="loss")
        (out["loss"] / out["num_items"]).backward()
        clipped += int(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM) > MAX_NORM)
        opt.step()
        opt.zero_grad()
    return model, clipped


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


class FirstLoss(tw.Hook):
    """The loss the first iteration reports (a test may read it on the host)."""

    def __init__(self) -> None:
        self.loss: float | None = None

    def after_train_iter(self, trainer: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
        if self.loss is None:
            self.loss = outputs["loss"].item()


def accumulated_run(tmp_path: Path, counted: bool, name: str) -> tuple[TinyGPT, FirstLoss]:
    """The Trainer: micro-batches of 8, accumulative_counts=2, AdamW, clipping."""
    model = TinyGPT(counted)
    first = FirstLoss()
    t = tw.Trainer(
        model=model,
        work_dir=tmp_path,
        train_dataloader=DataLoader(token_set(), batch_size=8),
        optim_wrapper=dict(
            optimizer=dict(type="AdamW", lr=LR), accumulative_counts=2, clip_grad=dict(max_norm=MAX_NORM)
        ),
        train_cfg=dict(by_epoch=False, max_iters=2 * UPDATES),
        default_hooks=dict(checkpoint=None),
        custom_hooks=[first],
        log_level="WARNING",
        experiment_name=name,
    )
    t.train()
    t.close()
    return model, first


def reference_micro_batch_means(updates: int = UPDATES) -> TinyGPT:
    """A hand-written loop of today's accumulation: each micro-batch of 8's token mean divided by the window size
    (2), clipped."""
    model = TinyGPT(counted=False)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    ids, labels = token_set().tensors
    for i in range(2 * updates):
        (model(ids[i * 8 : (i + 1) * 8], labels[i * 8 : (i + 1) * 8], mode="loss")["loss"] / 2).backward()
        if i % 2 == 1:
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            opt.zero_grad()
    return model


def test_accumulated_token_sums_equal_the_concatenated_batch_and_means_are_unchanged(tmp_path: Path) -> None:
    """2 x 8 sequences with num_items == one step on 16 (per-token mean), to 1e-6, and the logged loss is per token.

    Without num_items the update is today's, bitwise: micro-batch means divided by the window
    size, which is 1e-3 away from the concatenated batch (the reason for num_items).
    """
    reference, clipped = reference_big_batch()
    assert clipped > 0  # clipping acts: the gradients are normalised before it
    counted, first = accumulated_run(tmp_path, True, "counted")
    assert rel_l2(flat(counted), flat(reference)) < 1e-6
    ids, labels = token_set().tensors
    with torch.no_grad():
        expected = F.cross_entropy(
            TinyGPT(counted=False)(ids[:8]).flatten(0, 1), labels[:8].flatten(), ignore_index=-100
        )
    assert first.loss == pytest.approx(expected.item(), rel=1e-6)

    means, _ = accumulated_run(tmp_path, False, "means")
    assert torch.equal(flat(means), flat(reference_micro_batch_means()))
    assert rel_l2(flat(means), flat(reference)) > 1e-3


def test_a_window_resumed_from_its_state_keeps_its_count() -> None:
    """A checkpoint inside a window holds its items: the resumed wrapper's update equals the uninterrupted one,
    bitwise."""
    ids, labels = token_set().tensors
    a = TinyGPT(counted=True)
    ow_a = OptimWrapper(torch.optim.SGD(a.parameters(), lr=0.1), accumulative_counts=2)
    ow_a.initialize_count_status(a, 0, 2)
    out = a(ids[:8], labels[:8], mode="loss")
    ow_a.update_params(out["loss"], num_items=out["num_items"])
    state = copy.deepcopy(ow_a.state_dict())
    assert "partial_items" in state
    b = copy.deepcopy(a)
    ow_b = OptimWrapper(torch.optim.SGD(b.parameters(), lr=0.1), accumulative_counts=2)
    ow_b.load_state_dict(state)
    ow_b.initialize_count_status(b, 1, 2)
    for model, ow in ((a, ow_a), (b, ow_b)):
        out = model(ids[8:16], labels[8:16], mode="loss")
        ow.update_params(out["loss"], num_items=out["num_items"])
    assert torch.equal(flat(a), flat(b))


def test_counted_steps_read_nothing_back_to_the_host(sync_calls: Counter[str]) -> None:
    """train_step with num_items, accumulation and clipping: no .item() / bool() / .cpu() of a tensor, on the
    updating step too."""
    model = TinyGPT(counted=True)
    # SGD: torch's CPU Adam reads its step counter with .item() (a CPU tensor; not ours to count)
    ow = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=LR), accumulative_counts=2, clip_grad=dict(max_norm=MAX_NORM)
    )
    ow.initialize_count_status(model, 0, 4)
    ids, labels = token_set().tensors
    before = flat(model)
    sync_calls.clear()
    for i in range(4):
        model.train_step((ids[i * 8 : (i + 1) * 8], labels[i * 8 : (i + 1) * 8]), ow)
    assert sum(sync_calls.values()) == 0, sync_calls
    assert not torch.equal(flat(model), before)


def test_a_window_mixing_sums_and_means_is_an_error() -> None:
    ow = OptimWrapper(torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1), accumulative_counts=2)
    w = next(iter(ow.optimizer.param_groups[0]["params"]))
    ow.update_params(w.sum())
    with pytest.raises(ValueError, match="mixes losses with and without 'num_items'"):
        ow.update_params(w.sum(), num_items=3)


WORLD = 2


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    with gloo_group(rank, init_file, WORLD):
        model = TinyGPT(counted=True)
        t = tw.Trainer(
            model=model,
            work_dir=Path(out_dir) / f"rank{rank}",
            train_dataloader=DataLoader(token_set(), batch_size=4),
            optim_wrapper=dict(
                optimizer=dict(type="AdamW", lr=LR), accumulative_counts=2, clip_grad=dict(max_norm=MAX_NORM)
            ),
            train_cfg=dict(by_epoch=False, max_iters=2 * UPDATES),
            strategy="ddp",
            default_hooks=dict(checkpoint=None),
            log_level="WARNING",
            experiment_name="run",
        )
        t.train()
        t.close()
        del t  # the DDP wrapper must not outlive the process group
        torch.save(flat(model), Path(out_dir) / f"rank{rank}.pt")
        _, labels = token_set().tensors
        counts = [int((labels[rank::WORLD][i * 4 : (i + 1) * 4] != -100).sum()) for i in range(2 * UPDATES)]
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(counts))


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_processes_with_unequal_token_counts_equal_one_step_on_the_global_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DDP, 2 ranks x 2 micro-batches of 4 (rank 1 holds ~5x fewer tokens) == one process, one step per global batch
    of 16, to 1e-6."""
    use_gloo_env(monkeypatch, tmp_path)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    counts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert sum(counts[0]) > 3 * sum(counts[1])  # the ranks' windows hold very different numbers of tokens
    reference, clipped = reference_big_batch()
    assert clipped > 0
    for r in range(WORLD):
        assert rel_l2(torch.load(tmp_path / f"rank{r}.pt", weights_only=True), flat(reference)) < 1e-6
