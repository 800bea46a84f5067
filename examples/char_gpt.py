"""A config: a small GPT-style character model trained on text that ships with Python, in bf16.

The text is the help topics of ``pydoc_data`` (about 465,000 characters of Python's own
documentation); the model is a 2-layer causal transformer that learns to continue it.

Run:   trainwright train examples/char_gpt.py                      # about 300 iterations, < 60 s on 2 CPU cores
Plot:  trainwright plot work_dirs/char_gpt --keys loss val/loss lr --out char_gpt.png
Shorter: trainwright train examples/char_gpt.py --cfg-options train_cfg.max_iters=20

The classes below are registered when the config is loaded; the module-level variables are the config.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import trainwright as tw
from trainwright.evaluation import Metric
from trainwright.registry import DATASETS, HOOKS, METRICS, MODELS


def python_help_text() -> str:
    """The help topics of ``pydoc_data`` joined in name order; characters outside printable ASCII become ``?``."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return "".join(c if c == "\n" or 32 <= ord(c) < 127 else "?" for c in text)


_VOCAB = "\n" + "".join(chr(i) for i in range(32, 127))  # 96 characters: every one python_help_text() can hold


@DATASETS.register()
class PythonHelpText(Dataset):
    """Windows of ``block_size + 1`` characters of :func:`python_help_text` as (input, next-character target) pairs.

    The first ``1 - val_fraction`` of the text is the ``"train"`` split, the rest ``"val"``;
    windows start every ``stride`` characters.
    """

    def __init__(self, split: str = "train", block_size: int = 64, stride: int = 64, val_fraction: float = 0.1) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        text = python_help_text()
        cut = int(len(text) * (1 - val_fraction))
        text = text[:cut] if split == "train" else text[cut:]
        lookup = {c: i for i, c in enumerate(_VOCAB)}
        self.data = torch.tensor([lookup[c] for c in text], dtype=torch.long)
        self.block_size = block_size
        self.starts = range(0, len(self.data) - block_size - 1, stride)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[self.starts[i] : self.starts[i] + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class Attention(nn.Module):
    """Causal multi-head self-attention with separate ``q`` / ``k`` / ``v`` projections.

    Separate projections (not one fused ``qkv``) so that tensor parallelism can split each
    column-wise by heads; the reshape uses ``-1`` heads, so a rank holding a slice of the
    heads runs the same code (as torchtitan's attention does).
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(att.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """``fc2(gelu(fc1(x)))`` with a 4x wider hidden layer."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn, self.mlp = Attention(dim, heads), MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


@MODELS.register()
class CharGPT(tw.BaseModel):
    """A GPT-style character model: token + position embeddings, ``depth`` causal blocks, a linear head."""

    def __init__(
        self, vocab_size: int = len(_VOCAB), block_size: int = 64, dim: int = 128, depth: int = 2, heads: int = 4
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.zeros(1, block_size, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, mode: str = "tensor"):
        h = self.blocks(self.tok(x) + self.pos[:, : x.shape[1]])
        logits = self.head(self.ln(h))
        if mode == "tensor":
            return logits
        nll = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
        if mode == "loss":
            return {"loss": nll.mean()}
        return nll.mean(1)  # "predict": each sequence's mean loss per character, for CharLoss

    @torch.no_grad()
    def generate(self, prompt: str, length: int = 200) -> str:
        """Continue ``prompt`` greedily for ``length`` characters."""
        lookup = {c: i for i, c in enumerate(_VOCAB)}
        device = self.head.weight.device
        ids = torch.tensor([[lookup.get(c, lookup["?"]) for c in prompt]], device=device)
        block = self.pos.shape[1]
        for _ in range(length):
            nxt = self(ids[:, -block:])[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
        return "".join(_VOCAB[i] for i in ids[0].tolist())


@METRICS.register()
class CharLoss(Metric):
    """Mean cross-entropy per character (``loss``) and bits per character (``bpc``) over the evaluated text."""

    batched_results = True

    def process(self, data_batch, outputs) -> None:  # noqa: D102 - see Metric
        self.results.append(outputs.detach().float())

    def compute(self, results) -> dict[str, float]:  # noqa: D102 - see Metric
        nll = torch.cat(results).mean().item()
        return {"loss": nll, "bpc": nll / math.log(2)}


@HOOKS.register()
class SampleTextHook(tw.Hook):
    """After training, log what the model writes after ``prompt``."""

    def __init__(self, prompt: str = "The ", length: int = 160) -> None:
        self.prompt, self.length = prompt, length

    def after_train(self, trainer) -> None:  # noqa: D102 - see Hook
        model = trainer.unwrapped_model
        model.eval()
        trainer.logger.info(f"Sample after training:\n{model.generate(self.prompt, self.length)}")


work_dir = "work_dirs/char_gpt"
model = dict(type="CharGPT", block_size=64, dim=128, depth=2, heads=4)
train_dataloader = dict(
    dataset=dict(type="PythonHelpText", split="train", block_size=64, stride=32),
    batch_size=32,
    shuffle=True,
    drop_last=True,
)
val_dataloader = dict(dataset=dict(type="PythonHelpText", split="val", block_size=64, stride=64), batch_size=128)
val_evaluator = dict(type="CharLoss")
optim_wrapper = dict(
    optimizer=dict(type="AdamW", lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98)), clip_grad=dict(max_norm=1.0)
)
param_scheduler = [
    dict(type="LinearLR", start_factor=0.05, by_epoch=False, begin=0, end=30),
    dict(type="CosineAnnealingLR", by_epoch=False, begin=30, end=300, eta_min=3e-4),
]
train_cfg = dict(by_epoch=False, max_iters=300, val_interval=100)
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(by_epoch=False, interval=100, max_keep_ckpts=1))
custom_hooks = [dict(type="SampleTextHook", prompt="The ")]
precision = "bf16-mixed"
randomness = dict(seed=0)

# 2-D parallelism (docs/parallelism.md): FSDP over `dp`, each block's attention and MLP split over `tp` ranks.
# Column-wise layers give each rank a slice of the heads / hidden units, the row-wise layer after them sums the slices.
_tp_plan = {  # a helper variable (leading underscore: not a Trainer argument)
    "blocks.*.attn.q": "colwise",
    "blocks.*.attn.k": "colwise",
    "blocks.*.attn.v": "colwise",
    "blocks.*.attn.proj": "rowwise",
    "blocks.*.mlp.fc1": "colwise",
    "blocks.*.mlp.fc2": "rowwise",
}
# Uncomment and start 4 processes (a 2 x 2 mesh: 2 data shards of 16 samples, each model split over 2 ranks):
#   trainwright train examples/char_gpt.py --nproc 4
# strategy = dict(type="fsdp", tensor_parallel=dict(size=2, plan=_tp_plan))
# train_dataloader = {**train_dataloader, "batch_size": 16}  # per data shard: 2 shards x 16 = the 32 above
