"""A Hugging Face ``transformers`` model trains as it is: from its ``loss``, equal to a hand-written loop, and saves with ``save_pretrained``.

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
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(cfg)


def _samples(n: int) -> list[dict[str, torch.Tensor]]:
    """Token sequences with a prompt and right padding whose labels are -100 (not trained on), as a fine-tuning set has."""
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
        model=model, work_dir=tmp_path, experiment_name="hf", log_level="WARNING", randomness=dict(seed=0),
        train_dataloader=DataLoader(data, batch_size=BATCH),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR), clip_grad=dict(max_norm=1.0)),
        param_scheduler=lambda opt: transformers.get_linear_schedule_with_warmup(opt, WARMUP, ITERS),  # HF's schedule, per update
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
    hf_lr = [LR * (k / WARMUP if k < WARMUP else (ITERS - k) / (ITERS - WARMUP)) for k in range(ITERS)]  # HF's linear warmup + decay
    assert [r["lr"] for r in train] == pytest.approx(hf_lr, rel=1e-9)
    results = ("logit", "cache", "hidden", "attention", "past")
    assert not [k for r in train for k in r if any(s in k for s in results)]

    trained.save_pretrained(tmp_path / "hf_out")
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf_out")
    for k, v in again.state_dict().items():
        assert torch.equal(v, got[k]), k
    trainer.close()
