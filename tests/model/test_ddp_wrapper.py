"""The DDP wrapper as mmengine users call it: ``wrapper.train_step`` directly synchronises gradients;
``detect_anomalous_params``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainwright.model.wrappers import unused_parameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launch import launch  # noqa: E402


@pytest.mark.multiprocess
def test_train_step_called_directly_on_the_wrapper_keeps_the_ranks_equal(tmp_path: Path) -> None:
    """Two ranks, each on its own data, calling ``MMDistributedDataParallel(model).train_step`` themselves (accumulation
    2):
    the forward goes through DDP, so both end with the same weights, synchronising once per window;
    ``detect_anomalous_params``
    names the unused parameter; ``optim_context`` around torch's DDP in a hand-written loop synchronises once per
    window too."""
    launch(Path(__file__).with_name("ddp_wrapper_direct.py"), [str(tmp_path)], tmp_path, nproc=2, timeout=120)
    r0, r1 = (torch.load(tmp_path / f"result_rank{r}.pt", weights_only=True) for r in (0, 1))
    torch.manual_seed(0)
    start = nn.Linear(4, 1)  # the model's initial weights
    assert not torch.equal(r0["weights"]["linear.weight"], start.weight.detach())  # it trained
    for k, v in r0["weights"].items():
        assert torch.equal(v, r1["weights"][k]), k
    for r in (r0, r1):
        assert len(r["warnings"]) == 1 and "['spare.weight', 'spare.bias']" in r["warnings"][0]
        # accumulation 2: gradients are all-reduced at the window's last micro-batch only, as mmengine's optim_context
        # does
        assert r["wrapper_syncs"] == [False, True] * 3
        assert r["loop_syncs"] == [False, True] * 2
        # built by hand around a model with its own train_step, the wrapper says that it would not synchronise it, and
        # the fix
        assert len(r["own_step_warnings"]) == 1 and "OwnStep overrides train_step" in r["own_step_warnings"][0]
        assert "Trainer(strategy='ddp')" in r["own_step_warnings"][0]


def test_unused_parameters_walks_the_graph_of_every_loss() -> None:
    lin, other, frozen = nn.Linear(2, 1), nn.Linear(2, 1), nn.Linear(2, 1)
    frozen.requires_grad_(False)
    model = nn.ModuleDict(dict(lin=lin, other=other, frozen=frozen))
    x = torch.randn(3, 2)
    losses = {"loss": F.mse_loss(lin(x), torch.zeros(3, 1)), "acc": torch.tensor(1.0), "aux": [frozen(x).sum()]}
    assert unused_parameters(losses, model) == ["other.weight", "other.bias"]  # frozen parameters are not "unused"
    losses["loss_other"] = other(x).sum()
    assert unused_parameters(losses, model) == []
