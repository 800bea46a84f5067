"""mmengine's ``mmengine.dataset`` import path: samplers for loader dicts, collate functions, dataset wrappers.

``sampler=dict(type=DefaultSampler, shuffle=True)`` (mmengine's Python-style configs) and
``collate_fn=dict(type=pseudo_collate)`` work as their string spellings do; the work is
:mod:`trainwright.data`'s.
"""

from __future__ import annotations

from trainwright.data.collate import default_collate, pseudo_collate
from trainwright.data.loader_args import DefaultSampler, InfiniteSampler
from trainwright.data.wrappers import ClassBalancedDataset, ConcatDataset, RepeatDataset

__all__ = [
    "ClassBalancedDataset",
    "ConcatDataset",
    "DefaultSampler",
    "InfiniteSampler",
    "RepeatDataset",
    "default_collate",
    "pseudo_collate",
]
