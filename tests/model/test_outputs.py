"""Outputs that carry their loss as an attribute train from it alone; dicts of losses keep their contract.

No transformers here: the protocol is duck-typed (tests/model/test_hf_models.py runs a real
Hugging Face model).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from trainwright.model import as_base_model
from trainwright.optim import OptimWrapper


@dataclass
class Out:
    """An output object (not a mapping) with a loss and other results."""

    loss: torch.Tensor | None
    logits: torch.Tensor
    cache: Any = None


@dataclass
class DictOut(OrderedDict):
    """A dataclass that is also an ordered dict holding only its set fields, as transformers' ModelOutput."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for name in ("loss", "logits", "aux_loss"):
            if getattr(self, name) is not None:
                self[name] = getattr(self, name)


class Net(nn.Module):
    """A linear layer whose forward returns what ``kind`` says (as different libraries do)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3, 2)
        self.kind = kind

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
        logits = self.fc(x)
        loss = None if y is None else nn.functional.cross_entropy(logits, y)
        if self.kind == "object":
            return Out(loss=loss, logits=logits, cache=object())
        if self.kind == "modeloutput":
            return DictOut(loss=loss, logits=logits, aux_loss=None if loss is None else loss * 10)
        if self.kind == "tuple":
            return (loss, logits)
        return {
            "loss": loss,
            "loss_aux": loss * 10,
            "logits_mean": logits.mean(),
        }  # a plain dict: every 'loss' key summed


def _step(kind: str, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    model = as_base_model(Net(kind))
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    log = model.train_step(batch, wrapper)
    return log, [p.detach().clone() for p in model.parameters()]


def _reference(batch: dict[str, torch.Tensor], scale: float) -> list[torch.Tensor]:
    """One hand-written SGD step on ``scale`` times the cross-entropy."""
    ref = Net("reference")
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    (scale * nn.functional.cross_entropy(ref.fc(batch["x"]), batch["y"])).backward()
    opt.step()
    return [p.detach().clone() for p in ref.parameters()]


def test_loss_attribute_outputs_train_from_their_loss_and_log_only_it() -> None:
    g = torch.Generator().manual_seed(1)
    batch = {"x": torch.randn(4, 3, generator=g), "y": torch.tensor([0, 1, 1, 0])}
    expected = _reference(batch, 1.0)

    for kind in ("object", "modeloutput"):
        log, params = _step(kind, batch)
        assert list(log) == ["loss"], (
            kind
        )  # no logits, cache or aux_loss logged; aux_loss (already in a ModelOutput's loss) not added
        for got, exp in zip(params, expected):
            assert torch.equal(got, exp), kind

    # A plain dict keeps the dict-of-losses contract: loss + loss_aux summed, the rest logged.
    log, params = _step("dict", batch)
    assert set(log) == {"loss", "loss_aux", "logits_mean"}
    for got, exp in zip(params, _reference(batch, 11.0)):
        torch.testing.assert_close(got, exp, rtol=1e-6, atol=1e-7)
    assert log["loss_aux"].item() == pytest.approx(10 * log["loss"].item(), rel=1e-6)


def test_missing_loss_and_tuples_name_the_fix() -> None:
    x = torch.randn(4, 3)
    for kind in ("object", "modeloutput"):
        with pytest.raises(ValueError, match=r"loss is None.*`labels`"):
            _step(kind, {"x": x})  # no targets: the model computed no loss
    with pytest.raises(TypeError, match=r"returned tuple, not a loss.*return_dict=True"):
        _step("tuple", {"x": x, "y": torch.tensor([0, 1, 1, 0])})
