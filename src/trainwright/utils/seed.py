"""Seeding and determinism."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def set_random_seed(seed: int | None = None, deterministic: bool = False, rank_offset: int = 0) -> int:
    """Seed python, numpy and torch (all devices); optionally force deterministic algorithms.

    Args:
        seed: The seed; None draws a fresh one (and returns it, so it can be logged).
        deterministic: Use deterministic algorithms (``torch.use_deterministic_algorithms``,
            cudnn deterministic, ``CUBLAS_WORKSPACE_CONFIG``); may be slower.
        rank_offset: Added to the seed (``diff_rank_seed``: different data augmentation per rank).

    Returns:
        The seed used (before the rank offset).
    """
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    s = seed + rank_offset
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=False)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return seed
