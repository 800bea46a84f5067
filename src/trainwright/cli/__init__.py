"""The ``trainwright`` command line: ``train``, ``test``, ``val``, ``plot``, ``env`` (also ``python -m
trainwright``)."""

from trainwright.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
