"""OptimWrapper's seams: live parameters and one update path made of overridable methods.

A param group added after the wrapper is built (unfreezing a backbone) is clipped and
checkpointed like the others; methods replaced on the instance or overridden in a subclass
are the ones ``update_params`` runs. References are hand-written torch loops.
"""

from __future__ import annotations

import contextlib
import copy
import io
import weakref
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainwright.amp import MixedPrecision, Precision
from trainwright.optim import OptimWrapper
from trainwright.optim.engine import UpdateEngine

LR_BACKBONE, LR_HEAD = 0.1, 0.05


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(4, 4, generator=g), torch.randn(4, 2, generator=g)) for _ in range(n)]


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.mse_loss(model(batch[0]), batch[1]) * 50.0  # large gradients: clipping is active


def _late_group_optimizer(model: nn.Sequential, momentum: float = 0.0) -> torch.optim.SGD:
    """SGD over the head only; the backbone's group is added later (as when unfreezing it)."""
    return torch.optim.SGD(model[2].parameters(), lr=LR_HEAD, momentum=momentum)


def _add_backbone(opt: torch.optim.Optimizer, model: nn.Sequential) -> None:
    opt.add_param_group({"params": list(model[0].parameters()), "lr": LR_BACKBONE})


def _snapshot(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _change(before: list[torch.Tensor], module: nn.Module) -> torch.Tensor:
    return torch.linalg.vector_norm(
        torch.cat([(p.detach() - b).flatten() for b, p in zip(before, module.parameters())])
    )


@pytest.mark.parametrize(
    ("clip_grad", "torch_clip"),
    [
        (dict(max_norm=0.5), lambda ps: torch.nn.utils.clip_grad_norm_(ps, max_norm=0.5)),
        (dict(type="value", clip_value=0.05), lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.05)),
    ],
    ids=["norm", "value"],
)
def test_clipping_covers_a_param_group_added_after_construction(
    clip_grad: dict[str, Any], torch_clip: Callable[[list[torch.Tensor]], Any]
) -> None:
    model = _model()
    ref = copy.deepcopy(model)
    ow = OptimWrapper(_late_group_optimizer(model), clip_grad=clip_grad)
    _add_backbone(ow.optimizer, model)  # after the wrapper exists

    ref_opt = _late_group_optimizer(ref)
    _add_backbone(ref_opt, ref)
    ref_params = [p for g in ref_opt.param_groups for p in g["params"]]

    for batch in _batches(3):
        backbone_before, head_before = _snapshot(model[0]), _snapshot(model[2])
        ow.update_params(_loss(model, batch))

        _loss(ref, batch).backward()
        unclipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ref_params]))
        largest = max(p.grad.abs().max() for p in ref_params)
        torch_clip(ref_params)
        ref_opt.step()
        ref_opt.zero_grad()

        if "max_norm" in clip_grad:
            assert unclipped > clip_grad["max_norm"], "the test must actually clip"
            # ||lr * g|| <= lr * max_norm for each group: the added group is bounded like the first.
            assert _change(backbone_before, model[0]) <= LR_BACKBONE * clip_grad["max_norm"] * (1 + 1e-5)
            assert _change(head_before, model[2]) <= LR_HEAD * clip_grad["max_norm"] * (1 + 1e-5)
        else:
            assert largest > clip_grad["clip_value"], "the test must actually clip"
            for before, p in zip(backbone_before, model[0].parameters()):
                assert (p.detach() - before).abs().max() <= LR_BACKBONE * clip_grad["clip_value"] * (1 + 1e-5)
        for a, b in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_clip_grad_norm_reports_the_norm_over_every_group() -> None:
    model = _model()
    ow = OptimWrapper(_late_group_optimizer(model), clip_grad=dict(max_norm=0.5))
    _add_backbone(ow.optimizer, model)
    batch = _batches(1)[0]
    ref = copy.deepcopy(model)
    ow.update_params(_loss(model, batch))
    _loss(ref, batch).backward()
    torch.testing.assert_close(ow.grad_norm, torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5), atol=0, rtol=0)


def _acc_wrapper(model: nn.Sequential) -> OptimWrapper:
    ow = OptimWrapper(_late_group_optimizer(model, momentum=0.9), accumulative_counts=4)
    _add_backbone(ow.optimizer, model)
    return ow


def test_mid_window_checkpoint_holds_the_gradients_of_an_added_group() -> None:
    """Save after 6 of 8 micro-batches, restore into a fresh wrapper with the same added group, finish: bitwise
    equal."""
    batches = _batches(8)
    model = _model()
    ow = _acc_wrapper(model)
    ow.initialize_count_status(model, 0, 8)
    for batch in batches[:6]:  # one full window (momentum state exists), then 2 of the next 4
        ow.update_params(_loss(model, batch))
    state = ow.state_dict()

    current = [p for g in ow.optimizer.param_groups for p in g["params"]]
    assert len(state["partial_grads"]) == len(current) == 4
    for g, p in zip(state["partial_grads"], current):
        assert g is not None
        torch.testing.assert_close(g, p.grad, atol=0, rtol=0)
    buf = io.BytesIO()
    torch.save(state, buf)  # through bytes with weights_only=True, as a checkpoint would go
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)

    fresh = copy.deepcopy(model)  # the weights as saved
    for p in fresh.parameters():
        p.grad = None
    ow2 = _acc_wrapper(fresh)
    ow2.load_state_dict(loaded)
    ow2.initialize_count_status(fresh, 6, 8)  # what the loop does from its Progress after a resume
    for batch in batches[6:]:
        ow.update_params(_loss(model, batch))
        ow2.update_params(_loss(fresh, batch))
    for a, b in zip(model.parameters(), fresh.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)

    # Reference: two SGD steps, each on the mean over its window's micro-batches.
    ref = _model()
    ref_opt = _late_group_optimizer(ref, momentum=0.9)
    _add_backbone(ref_opt, ref)
    for window in (batches[:4], batches[4:]):
        for batch in window:
            (_loss(ref, batch) / 4).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    for a, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, r, atol=1e-6, rtol=1e-5)


def test_loading_partial_grads_into_fewer_parameters_names_both_counts_and_the_fix() -> None:
    model = _model()
    ow = _acc_wrapper(model)
    ow.update_params(_loss(model, _batches(1)[0]))
    state = ow.state_dict()
    fresh = _model()
    ow2 = OptimWrapper(
        _late_group_optimizer(fresh, momentum=0.9), accumulative_counts=4
    )  # the backbone group not added
    before = copy.deepcopy(ow2.optimizer.state_dict())
    with pytest.raises(ValueError, match=r"for 4 parameters.*have 2.*add_param_group"):
        ow2.load_state_dict(state)
    assert ow2.optimizer.state_dict() == before  # nothing loaded
    assert all(p.grad is None for p in fresh.parameters())


def _plain_run(accumulative_counts: int, n: int) -> list[torch.Tensor]:
    model = _model()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=accumulative_counts)
    for batch in _batches(n):
        ow.update_params(_loss(model, batch))
    return _snapshot(model)


def test_methods_patched_on_the_instance_are_called_at_the_right_counts() -> None:
    model = _model()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2)
    with (
        mock.patch.object(ow, "backward", wraps=ow.backward) as backward,
        mock.patch.object(ow, "step", wraps=ow.step) as step,
        mock.patch.object(ow, "zero_grad", wraps=ow.zero_grad) as zero_grad,
    ):
        for batch in _batches(4):
            ow.update_params(_loss(model, batch))
    assert (backward.call_count, step.call_count, zero_grad.call_count) == (4, 2, 2)
    for a, b in zip(model.parameters(), _plain_run(2, 4)):  # wrapping changed nothing
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_a_step_replaced_on_the_instance_replaces_the_update() -> None:
    model = _model()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), clip_grad=dict(max_norm=0.5))
    before = _snapshot(model)
    with mock.patch.object(ow, "step") as step:
        for batch in _batches(2):
            ow.update_params(_loss(model, batch))
        ow.update_params(_loss(model, _batches(1)[0]), step_kwargs=dict(closure=None))
    assert step.call_args_list == [mock.call(), mock.call(), mock.call(closure=None)]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "weights moved without step"


def test_subclass_overrides_of_step_and_backward_are_honoured() -> None:
    class EveryOtherStep(OptimWrapper):
        """Steps only on odd updates; back-propagates half the loss."""

        steps = 0

        def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
            super().backward(loss * 0.5, **kwargs)

        def step(self, **kwargs: Any) -> None:
            self.steps += 1
            if self.steps % 2:
                super().step(**kwargs)

    model = _model()
    ref = copy.deepcopy(model)
    ow = EveryOtherStep(torch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for i, batch in enumerate(_batches(4)):
        ow.update_params(_loss(model, batch))
        (_loss(ref, batch) * 0.5).backward()
        if i % 2 == 0:
            ref_opt.step()
        ref_opt.zero_grad()
    assert ow.steps == 4
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_scale_loss_and_should_update_are_asked_per_micro_batch_when_accumulating() -> None:
    """accumulative_counts > 1: every micro-batch is scaled and asked whether it closes a window (overrides take part);
    accumulative_counts=1: each call is a whole window, backward sees the loss itself and every call steps."""
    model = _model()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2)
    ow.initialize_count_status(model, 0, 4)
    with (
        mock.patch.object(ow, "scale_loss", wraps=ow.scale_loss) as scale,
        mock.patch.object(ow, "should_update", return_value=False) as should,
    ):
        for batch in _batches(4):
            ow.update_params(_loss(model, batch))
    assert (scale.call_count, should.call_count) == (4, 4)
    assert all(p.grad is not None for p in model.parameters()), (
        "should_update said never: the gradients stay accumulated"
    )

    model = _model()
    one = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    seen: list[torch.Tensor] = []
    with (
        mock.patch.object(one, "backward", side_effect=lambda loss: seen.append(loss)),
        mock.patch.object(one, "step") as step,
    ):
        losses = [_loss(model, batch) for batch in _batches(3)]
        for loss in losses:
            one.update_params(loss)
    assert all(a is b for a, b in zip(seen, losses)) and step.call_count == 3


class _NoSync(UpdateEngine):
    """A strategy that can suppress gradient sync (as DDP does)."""

    def no_sync_context(self) -> Any:
        return lambda m: contextlib.nullcontext()


def test_context_free_follows_precision_no_sync_and_a_subclass_context() -> None:
    model = _model()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    assert ow.context_free
    ow.precision = MixedPrecision("bfloat16")
    assert not ow.context_free
    ow.precision = Precision()
    assert ow.context_free
    syncing = _NoSync()
    ow.strategy = syncing
    assert ow.context_free  # accumulative_counts=1: every backward closes its window and syncs, nothing to suppress
    ow.strategy = UpdateEngine()
    assert ow.context_free
    acc = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2)
    assert (
        not acc.context_free
    )  # no strategy (the user's own loop): a DDP model's own no_sync inside windows, as mmengine's optim_context
    acc.strategy = syncing
    assert not acc.context_free
    acc.strategy = UpdateEngine()
    assert acc.context_free

    class Traced(OptimWrapper):
        def optim_context(self, model: nn.Module) -> Any:
            return super().optim_context(model)

    assert not Traced(torch.optim.SGD(model.parameters(), lr=0.1)).context_free
    with pytest.raises(TypeError, match="precision must be"):
        ow.precision = "16-mixed"  # type: ignore[assignment]


def test_a_strategys_clip_grad_serves_every_clip_grad_assigned_later() -> None:
    """A strategy's ``clip_grad`` (e.g. FSDP's "the sharded total norm as a plain tensor") is called with the clip
    function of the
    ``clip_grad`` already set and of every one assigned afterwards (as a hook does after the run is prepared); the
    clipping
    itself stays torch's: the same norms and weights as ``clip_grad_norm_`` at each step's threshold."""
    model = _model()
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    seen: list[torch.Tensor] = []

    class Recording(UpdateEngine):
        def clip_grad(
            self, clip: Callable[[list[torch.Tensor]], torch.Tensor], params: list[torch.Tensor]
        ) -> torch.Tensor:
            seen.append(clip(params))
            return seen[-1]

    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), clip_grad=dict(max_norm=5.0), strategy=Recording())
    for max_norm, batch in zip((5.0, 0.5, 0.25), _batches(3)):
        ow.clip_grad = dict(max_norm=max_norm)
        ow.update_params(_loss(model, batch))
        _loss(ref, batch).backward()
        expected = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
        ref_opt.step()
        ref_opt.zero_grad()
        assert seen[-1] is ow.grad_norm
        torch.testing.assert_close(ow.grad_norm, expected, atol=0, rtol=0)
    assert len(seen) == 3
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    ow.clip_grad = dict(type="value", clip_value=0.01)  # value clipping goes through it too
    ow.update_params(_loss(model, _batches(1)[0]))
    assert len(seen) == 4 and seen[-1] is ow.grad_norm
    ow.strategy = UpdateEngine()  # torch's function as is again
    ow.update_params(_loss(model, _batches(1)[0]))
    assert len(seen) == 4 and ow.grad_norm is not seen[-1]
    with pytest.raises(TypeError, match="strategy must be a trainwright Strategy"):
        ow.strategy = "fsdp"  # type: ignore[assignment]


def _accumulator_hook(param: nn.Parameter, calls: list[int]) -> None:
    """Register a hook on ``param``'s gradient accumulator, holding no reference to the accumulator itself.

    The accumulator found this way is the one the last graph through ``param`` used, if that
    graph is still alive; otherwise a new one, which dies with this function's view.
    """
    acc = param.view_as(param).grad_fn.next_functions[0][0]
    acc.register_hook(lambda *_: calls.append(1))


@pytest.mark.parametrize("precision", [Precision(), MixedPrecision("bfloat16")])
def test_the_next_step_reuses_each_parameters_gradient_accumulator(precision: Precision) -> None:
    # A hand-written loop keeps `loss` (and its spent graph) until the next forward, so autograd
    # reuses each parameter's accumulator: a hook registered on it between steps fires in the next
    # backward. The wrapper keeps the last loss the same way, so the same holds through it.
    model = _model()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), precision=precision)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    ow.update_params(F.cross_entropy(model(x), y))
    calls: list[int] = []
    _accumulator_hook(model[0].weight, calls)
    ow.update_params(F.cross_entropy(model(x), y))
    assert calls == [1]
    ow.update_params(F.cross_entropy(model(x), y))  # and from then on at every step
    assert calls == [1, 1]


def test_a_backward_that_keeps_its_graph_is_not_held_and_copies_drop_the_kept_loss() -> None:
    model = _model()
    ow = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    loss = F.cross_entropy(model(x), y)
    ow.backward(loss, retain_graph=True)  # its saved tensors must not outlive the caller's reference
    freed: list[bool] = []
    weakref.finalize(loss, freed.append, True)
    del loss
    assert freed == [True]
    ow.update_params(F.cross_entropy(model(x), y))  # a spent graph is kept ...
    copied = copy.deepcopy(ow)  # ... but never copied (autograd cannot deep-copy a non-leaf tensor)
    assert copied.optimizer.state_dict()["state"].keys() == ow.optimizer.state_dict()["state"].keys()
