"""``trainwright ckpt``: commands on checkpoint files (``convert``, ``inspect``, ``diff``).

``trainwright ckpt convert --from mmengine SRC DST`` rewrites an mmengine checkpoint as plain
data (tensors, numbers, strings, containers) that ``torch.load(weights_only=True)`` reads, running
no code from ``SRC`` (:mod:`trainwright.checkpoint.mmengine_ckpt`). ``ckpt inspect PATH`` and
``ckpt diff A B`` print what :mod:`trainwright.checkpoint.inspect` finds (a file, a sharded directory or a URL).
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
        "ckpt",
        help="commands on checkpoint files (convert, inspect, diff)",
        description="Commands on checkpoint files.",
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
    inspect = actions.add_parser(
        "inspect",
        help="list a checkpoint's pieces, tensors, settings and versions",
        description="List what a checkpoint holds: its pieces, every tensor (dtype, shape, bytes), the run's settings "
        "and the trainwright and torch versions that wrote it. PATH: a .pth file, a sharded (.dcp) directory or a URL "
        "(s3://..., credentials and endpoint from the environment).",
    )
    inspect.add_argument("path", metavar="PATH", help="the checkpoint")
    inspect.add_argument("--debug", action="store_true", help="show full tracebacks")
    diff = actions.add_parser(
        "diff",
        help="compare two checkpoints tensor by tensor (exit status 0: equal, 1: different)",
        description="Compare two checkpoints: each tensor bitwise (else its max abs and max relative difference), with "
        "a checksum of each side; the settings and other values that differ. Exit status 0 when they are equal, 1 when "
        "they differ, 2 when one cannot be read.",
    )
    diff.add_argument("a", metavar="A", help="the first checkpoint (file, sharded directory or URL)")
    diff.add_argument("b", metavar="B", help="the second checkpoint")
    diff.add_argument("--all", action="store_true", help="list the equal tensors too")
    diff.add_argument("--debug", action="store_true", help="show full tracebacks")
    return ckpt


def read_any(path: str, data: bool = True) -> dict[str, Any]:
    """Read the checkpoint at ``path`` whole in this process (a file, a sharded directory, a URL), running no code.

    ``data=False``: a sharded directory's tensors are ``meta`` tensors (shape and dtype, nothing read of their data).

    Raises:
        ConfigError: it does not exist or cannot be read (the message names it and why).
    """
    from trainwright.checkpoint import CheckpointError
    from trainwright.strategies.base import Strategy

    try:
        if not data:
            from trainwright.strategies import dcp_io

            if dcp_io.is_dcp_checkpoint(path):
                return dcp_io.load_outline(path)
        return Strategy(device="cpu").read_checkpoint(path)
    except (CheckpointError, FileNotFoundError, IsADirectoryError) as e:
        raise ConfigError(str(e)) from e


def ckpt_command(args: argparse.Namespace) -> int:
    """Run ``trainwright ckpt ACTION``; return the exit status (a file that cannot be read is a ConfigError: one
    line, status 2)."""
    from trainwright.checkpoint import CheckpointError
    from trainwright.checkpoint import inspect as ckpt_inspect
    from trainwright.checkpoint.mmengine_ckpt import convert_mmengine_checkpoint

    if args.ckpt_command == "inspect":
        print(ckpt_inspect.format_summary(ckpt_inspect.summarize(read_any(args.path, data=False), args.path)))
        return 0
    if args.ckpt_command == "diff":
        found = ckpt_inspect.compare(read_any(args.a), read_any(args.b))
        print(ckpt_inspect.format_diff(found, args.a, args.b, show_equal=args.all))
        return 0 if found.equal else 1
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


__all__ = ["CONVERT_FORMATS", "add_ckpt_parser", "ckpt_command", "read_any"]
