"""A Hugging Face ``transformers`` model trains as it is: from its ``loss``, equal to a hand-written loop, and saves
with ``save_pretrained``.

The model is built from a small config (no download). Dropout is off so the Trainer and the
reference loop see the same function; the data order is the loader's (no shuffling).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
from conftest import train_records
from torch.utils.data import DataLoader

import trainwright as tw

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, BATCH, ITERS, WARMUP, LR = 64, 16, 4, 6, 2, 3e-2


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(cfg)


def _samples(n: int) -> list[dict[str, torch.Tensor]]:
    """Token sequences with a prompt and right padding whose labels are -100 (not trained on), as a fine-tuning set
    has."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        ids = torch.randint(1, VOCAB, (SEQ,), generator=g)
        length = SEQ - i % 5  # padded to SEQ
        mask = (torch.arange(SEQ) < length).long()
        labels = ids.masked_fill(mask == 0, -100)
        labels[: 2 + i % 3] = -100  # the prompt
        out.append(dict(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, labels=labels))
    return out


def test_gpt2_trains_as_it_is_equal_to_a_hand_loop_and_round_trips_save_pretrained(tmp_path: Path) -> None:
    data = _samples(BATCH * ITERS)
    model = _gpt2()
    ref = copy.deepcopy(model)

    trainer = tw.Trainer(
        model=model,
        work_dir=tmp_path,
        experiment_name="hf",
        log_level="WARNING",
        randomness=dict(seed=0),
        train_dataloader=DataLoader(data, batch_size=BATCH),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR), clip_grad=dict(max_norm=1.0)),
        param_scheduler=lambda opt: transformers.get_linear_schedule_with_warmup(
            opt, WARMUP, ITERS
        ),  # HF's schedule, per update
        train_cfg=dict(by_epoch=False, max_iters=ITERS),
        default_hooks=dict(logger=dict(interval=1), checkpoint=None),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    about_losses = [str(w.message) for w in caught if "loss" in str(w.message).lower()]
    assert not about_losses
    log = trainer.run_dir / "train.log"
    assert not [line for line in (log.read_text().splitlines() if log.exists() else []) if "WARNING" in line]

    # The same training written by hand: AdamW, the same batches in the same order, the model's own loss.
    ref.train()
    opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    sched = transformers.get_linear_schedule_with_warmup(opt, WARMUP, ITERS)
    ref_losses = []
    for batch in DataLoader(data, batch_size=BATCH):
        loss = ref(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        ref_losses.append(loss.item())

    trained = trainer.unwrapped_model
    assert trained is model  # the user's own object, not an adapter
    got, want = trained.state_dict(), ref.state_dict()
    assert list(got) == list(want)
    for k in got:
        assert torch.equal(got[k], want[k]), k  # bitwise

    train = train_records(trainer.run_dir)
    assert [r["iter"] for r in train] == list(range(1, ITERS + 1))
    assert [r["loss"] for r in train] == pytest.approx(ref_losses, rel=1e-6)
    assert max(r["grad_norm"] for r in train) > 1.0  # clipping acted
    hf_lr = [
        LR * (k / WARMUP if k < WARMUP else (ITERS - k) / (ITERS - WARMUP)) for k in range(ITERS)
    ]  # HF's linear warmup + decay
    assert [r["lr"] for r in train] == pytest.approx(hf_lr, rel=1e-9)
    results = ("logit", "cache", "hidden", "attention", "past")
    assert not [k for r in train for k in r if any(s in k for s in results)]

    trained.save_pretrained(tmp_path / "hf_out")
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf_out")
    for k, v in again.state_dict().items():
        assert torch.equal(v, got[k]), k
    trainer.close()


class CountedLM(tw.BaseModel):
    """docs/coming_from.md's recipe: a Hugging Face causal LM reporting its loss as a sum over its target tokens,
    with their number."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, labels: torch.Tensor | None = None, mode: str = "tensor", **batch: torch.Tensor) -> object:
        if mode != "loss":
            return self.lm(**batch, labels=labels)
        summed = self.lm(
            **batch, labels=labels, num_items_in_batch=1
        ).loss  # HF's loss: sum over tokens / num_items_in_batch
        return dict(loss=summed, num_items=(labels[..., 1:] != -100).sum())  # the targets of the shifted labels


def test_token_weighted_accumulation_of_a_hf_model_equals_the_concatenated_batch(tmp_path: Path) -> None:
    """Micro-batches with unequal target-token counts, accumulated 2 x 4, equal one step on the batch of 8 (HF's own
    mean loss on it)."""
    acc, updates = 2, 3
    data = _samples(BATCH * acc * updates)
    lm = _gpt2()
    ref = copy.deepcopy(lm)
    trainer = tw.Trainer(
        model=CountedLM(lm),
        work_dir=tmp_path,
        experiment_name="counted",
        log_level="WARNING",
        randomness=dict(seed=0),
        train_dataloader=DataLoader(data, batch_size=BATCH),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.5), accumulative_counts=acc),
        train_cfg=dict(by_epoch=False, max_iters=acc * updates),
        default_hooks=dict(checkpoint=None),
    )
    trainer.train()
    opt = torch.optim.SGD(
        ref.parameters(), lr=0.5
    )  # SGD: the weights show the gradients' difference (Adam's normalisation amplifies rounding)
    for batch in DataLoader(data, batch_size=BATCH * acc):
        ref(**batch).loss.backward()  # the mean over the target tokens of the whole window
        opt.step()
        opt.zero_grad()
    diff = torch.cat([(a - b).flatten() for a, b in zip(lm.parameters(), ref.parameters())])
    norm = torch.cat([b.flatten() for b in ref.parameters()])
    assert (diff.norm() / norm.norm()).item() < 1e-6  # measured 2e-8; the plain model's per-micro-batch means: 1.4e-3
    trainer.close()
