"""Every rank's unfinished accumulation window in one checkpoint (optim/window_state.py): each rank resumes its own;
a checkpoint of another number of processes warns naming the fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import trainwright as tw
from trainwright.optim.window_state import gather_windows, own_window


def _in_window(scale: float) -> tuple[nn.Module, tw.OptimWrapper]:
    """A wrapper one micro-batch into a window of 2, its gradient ``scale`` times the one of ``scale=1``."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    ow = tw.OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2)
    ow.update_params(model(torch.ones(4, 3)).sum() * scale)
    return model, ow


def _grads(state: Any) -> list[torch.Tensor]:
    return list(state["partial_grads"])


def test_each_rank_resumes_its_own_window_and_another_world_size_warns() -> None:
    ranks = [_in_window(1.0), _in_window(3.0)]
    saved = [ow.state_dict() for _, ow in ranks]
    rank1 = {"": {"partial_grads": saved[1]["partial_grads"]}}  # what rank 1 hands the gather
    state = gather_windows(dict(saved[0]), ranks[0][1], lambda own: [own, rank1], world_size=2)  # rank 0 writes it
    assert len(state["window_per_rank"]) == 2

    for rank in (0, 1):
        mine = own_window(state, ranks[rank][1], rank, world_size=2)
        assert "window_per_rank" not in mine
        assert all(torch.equal(a, b) for a, b in zip(_grads(mine), _grads(saved[rank]), strict=True))
        model, ow = _in_window(0.0)
        ow.load_state_dict(mine)
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), _grads(saved[rank]), strict=True))

    with pytest.warns(UserWarning, match=r"by 2 process\(es\).*this run has 1.*Resume with 2 process\(es\)"):
        alone = own_window(state, ranks[0][1], 0, world_size=1)
    for a, b, m in zip(_grads(saved[0]), _grads(saved[1]), _grads(alone), strict=True):
        assert torch.equal(m, torch.stack([a, b]).mean(0))  # the window's averaged gradient keeps what was accumulated

    assert gather_windows(dict(saved[0]), ranks[0][1], lambda own: pytest.fail("no gather"), world_size=1) == saved[0]
