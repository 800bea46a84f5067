"""``trainwright ckpt``: commands on checkpoint files (a group: ``ckpt convert``; more may join it).

``trainwright ckpt convert --from mmengine SRC DST`` rewrites an mmengine checkpoint as plain
data (tensors, numbers, strings, containers) that ``torch.load(weights_only=True)`` reads, running
no code from ``SRC`` (:mod:`trainwright.checkpoint.mmengine_ckpt`).
"""

from __future__ import annotations

import argparse
from typing import Any

from trainwright.registry import ConfigError

#: The formats ``ckpt convert --from`` reads.
CONVERT_FORMATS = ("mmengine",)


def add_ckpt_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``ckpt`` and its sub-commands to ``sub`` (the ``trainwright`` sub-parsers); return the group's parser."""
    ckpt = sub.add_parser(
        "ckpt", help="commands on checkpoint files (convert)", description="Commands on checkpoint files."
    )
    actions = ckpt.add_subparsers(dest="ckpt_command", metavar="ACTION", required=True)
    convert = actions.add_parser(
        "convert",
        help="rewrite another engine's checkpoint as plain data, running no code from it",
        description="Rewrite another engine's checkpoint as plain data that torch.load(weights_only=True) reads; "
        "nothing in SRC is executed.",
    )
    convert.add_argument(
        "--from", dest="source_format", required=True, choices=CONVERT_FORMATS, help="the engine that wrote SRC"
    )
    convert.add_argument("src", metavar="SRC", help="the checkpoint to read")
    convert.add_argument("dst", metavar="DST", help="the file to write (atomically)")
    convert.add_argument("--debug", action="store_true", help="show full tracebacks")
    return ckpt


def ckpt_command(args: argparse.Namespace) -> int:
    """Run ``trainwright ckpt ACTION``; return the exit status (a file that cannot be read is a ConfigError: one
    line, status 2)."""
    from trainwright.checkpoint import CheckpointError
    from trainwright.checkpoint.mmengine_ckpt import convert_mmengine_checkpoint

    try:
        ckpt = convert_mmengine_checkpoint(args.src, args.dst)
    except (CheckpointError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from e
    weights = ckpt.get("state_dict", ckpt.get("model"))
    count = sum(1 for _ in weights) if isinstance(weights, dict) else 0
    print(
        f"wrote {args.dst}: keys {sorted(ckpt)}, {count} weight tensors; load it with load_from={args.dst!r} (or "
        "torch.load(path, weights_only=True))"
    )
    return 0


__all__ = ["CONVERT_FORMATS", "add_ckpt_parser", "ckpt_command"]
