"""A config: the character GPT of char_gpt.py trained from a stream of local text shards, with 2 loader workers.

The training text is written once as JSON-lines shards (one window of text per line) under ``shards_dir``, then read
as a Hugging Face streaming dataset (nothing is loaded into memory; needs ``pip install "trainwright[hf]"``). The
stream's position, every loader worker's, is saved with each checkpoint, so a resumed run goes on from where it
stopped without reading the stream again (docs/data.md). Under several processes each rank reads its own shards.

Run:      trainwright train examples/char_gpt_stream.py
Resume:   trainwright train examples/char_gpt_stream.py --resume          (after a kill: the same samples follow)
2 ranks:  trainwright train examples/char_gpt_stream.py --nproc 2         (each reads 4 of the 8 shards)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainwright.registry import DATASETS

_base_ = "char_gpt.py"  # the model, the validation set, the optimizer, the schedule and the hooks


def write_text_shards(folder: str, shards: int, block_size: int) -> list[str]:
    """The training text of ``PythonHelpText`` as ``shards`` JSON-lines files of ``block_size + 1``-character windows
    (written once; kept for the next run)."""
    from pydoc_data.topics import topics

    out = Path(folder)
    files = [out / f"shard{i:02d}.jsonl" for i in range(shards)]
    if all(f.exists() for f in files):
        return [str(f) for f in files]
    text = "\n\n".join(topics[k] for k in sorted(topics))
    text = "".join(c if c == "\n" or 32 <= ord(c) < 127 else "?" for c in text)
    text = text[: int(len(text) * 0.9)]  # the train split of char_gpt.py's PythonHelpText
    windows = [text[i : i + block_size + 1] for i in range(0, len(text) - block_size - 1, block_size // 2)]
    out.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(files):
        tmp = f.with_suffix(f".{os.getpid()}.tmp")  # several processes may write at once
        tmp.write_text("".join(json.dumps({"text": w}) + "\n" for w in windows[i::shards]))
        tmp.replace(f)
    return [str(f) for f in files]


def _encode(example: dict[str, str]) -> dict[str, list[int]]:
    ids = [ord(c) - 31 if c != "\n" else 0 for c in example["text"]]  # char_gpt.py's vocabulary: "\n", then ASCII 32..
    return {"x": ids[:-1], "y": ids[1:]}


@DATASETS.register()
def python_help_stream(
    shards_dir: str = "work_dirs/char_gpt_stream/shards", shards: int = 8, block_size: int = 64
) -> Any:
    """The text shards as a Hugging Face streaming dataset of ``{"x", "y"}`` tensors (no ``__len__``: endless)."""
    import datasets

    files = write_text_shards(shards_dir, shards, block_size)
    stream = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    return stream.map(_encode, remove_columns=["text"]).with_format("torch")


work_dir = "work_dirs/char_gpt_stream"
train_dataloader = dict(
    _delete_=True,  # not the base's map-style dataset with shuffle=True: a stream has its own order
    dataset=dict(type="python_help_stream", shards=8, block_size=64),
    batch_size=32,
    num_workers=2,
)
