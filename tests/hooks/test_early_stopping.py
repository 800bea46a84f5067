"""EarlyStoppingHook: stops after `patience` bad validations, infers the rule, resumes its counters."""

from __future__ import annotations

import logging
import math
import types

import pytest

from trainwright.hooks.dispatch import HookList
from trainwright.hooks.early_stopping import EarlyStoppingHook
from trainwright.logging.agreement import Agreement
from trainwright.loops.control import RunControl
from trainwright.registry import HOOKS
from trainwright.utils.progress import Progress


def _trainer() -> types.SimpleNamespace:
    """What the hook uses of a trainer: a train loop with its run control (one process)."""
    loop = types.SimpleNamespace(control=RunControl(Agreement(None)))
    return types.SimpleNamespace(
        model=None, unwrapped_model=None, progress=Progress(), logger=logging.getLogger("t.early"), train_loop=loop
    )


def _stopped(trainer: types.SimpleNamespace) -> bool:
    """The hook asked the run control to stop (on one process the stop is decided at once)."""
    control = trainer.train_loop.control
    return control.agreement.finish and (control.stop_reason or "").startswith("early stopping: ")


def _feed(hook: EarlyStoppingHook, trainer, values: list[float], key: str | None = None) -> int | None:
    """Validate with each value in turn (as the train loop would); return the 1-based index that stopped."""
    hook.before_train(trainer)
    for i, value in enumerate(values, 1):
        trainer.progress.epoch += 1
        hook.after_val_epoch(trainer, {key or hook.monitor: value, "val/other": 0.0})
        if _stopped(trainer):
            return i
    return None


@pytest.mark.parametrize("patience", [1, 2, 3])
def test_stops_exactly_after_patience_bad_validations(patience: int, caplog: pytest.LogCaptureFixture) -> None:
    hook, t = EarlyStoppingHook("val/acc", patience=patience), _trainer()
    improving = [0.5, 0.6, 0.7]
    stalled = [0.69, 0.7, 0.65, 0.68, 0.7]  # none beats 0.7 (an equal value is not an improvement)
    with caplog.at_level(logging.INFO, logger="t.early"):
        stopped_at = _feed(hook, t, improving + stalled)
    assert stopped_at == len(improving) + patience
    assert hook.best_score == 0.7 and hook.wait_count == patience
    assert "val/acc did not improve" in caplog.text and f"patience {patience}" in caplog.text


def test_an_improvement_resets_the_count() -> None:
    hook, t = EarlyStoppingHook("val/acc", patience=3), _trainer()
    assert _feed(hook, t, [0.5, 0.4, 0.4, 0.55, 0.5, 0.5]) is None
    assert hook.wait_count == 2 and hook.best_score == 0.55
    assert _feed(hook, t, [0.5]) == 1


@pytest.mark.parametrize(
    ("monitor", "rule", "expected"),
    [
        ("val/loss", None, "less"),
        ("val/loss_cls", None, "less"),
        ("val/acc", None, "greater"),
        ("val/mIoU", None, "greater"),
        ("val/error", "less", "less"),
    ],
)
def test_rule_inference(monitor: str, rule: str | None, expected: str) -> None:
    assert EarlyStoppingHook(monitor, rule=rule).rule == expected


def test_less_rule_stops_when_loss_stalls() -> None:
    hook, t = EarlyStoppingHook("val/loss", patience=2), _trainer()
    assert _feed(hook, t, [1.0, 0.8, 0.9, 0.85]) == 4
    assert hook.best_score == 0.8


@pytest.mark.parametrize(
    ("monitor", "values"), [("val/acc", [0.50, 0.55, 0.58, 0.59]), ("val/loss", [1.0, 0.95, 0.92, 0.91])]
)
def test_min_delta(monitor: str, values: list[float]) -> None:
    # steps of 0.01..0.05 are improvements without min_delta, not with min_delta=0.1
    hook, t = EarlyStoppingHook(monitor, patience=3), _trainer()
    assert _feed(hook, t, values) is None and hook.best_score == values[-1]
    hook, t = EarlyStoppingHook(monitor, patience=3, min_delta=0.1), _trainer()
    assert _feed(hook, t, values) == 4 and hook.best_score == values[0]


def test_non_finite_value_stops_at_once(caplog: pytest.LogCaptureFixture) -> None:
    hook, t = EarlyStoppingHook("val/loss", patience=10), _trainer()
    with caplog.at_level(logging.INFO, logger="t.early"):
        assert _feed(hook, t, [1.0, math.nan]) == 2
    assert "not finite" in caplog.text
    hook, t = EarlyStoppingHook("val/loss", patience=2, check_finite=False), _trainer()
    assert _feed(hook, t, [1.0, math.nan, math.inf]) == 3  # counted as bad validations instead


def test_stopping_threshold() -> None:
    hook, t = EarlyStoppingHook("val/acc", patience=10, stopping_threshold=0.9), _trainer()
    assert _feed(hook, t, [0.5, 0.8, 0.9, 0.95]) == 3
    hook, t = EarlyStoppingHook("val/loss", patience=10, stopping_threshold=0.1), _trainer()
    assert _feed(hook, t, [0.5, 0.2, 0.05]) == 3


def test_missing_key_warns_or_errors_listing_available_keys() -> None:
    hook, t = EarlyStoppingHook("val/accuracy"), _trainer()
    with pytest.warns(UserWarning, match=r"\['val/acc', 'val/loss'\].*Did you mean 'val/acc'"):
        hook.after_val_epoch(t, {"val/acc": 0.5, "val/loss": 1.0})
    assert not _stopped(t) and hook.wait_count == 0
    strict = EarlyStoppingHook("val/accuracy", strict=True)
    with pytest.raises(KeyError, match=r"not among the validation metrics \['val/acc', 'val/loss'\]"):
        strict.after_val_epoch(t, {"val/acc": 0.5, "val/loss": 1.0})


def test_state_round_trip_stops_where_the_uninterrupted_run_does() -> None:
    values = [0.5, 0.6, 0.55, 0.58, 0.59, 0.57]
    full, t = EarlyStoppingHook("val/acc", patience=4), _trainer()
    assert _feed(full, t, values) == 6

    first, t1 = EarlyStoppingHook("val/acc", patience=4), _trainer()
    assert _feed(first, t1, values[:3]) is None
    state = first.state_dict()
    assert state == {"monitor": "val/acc", "rule": "greater", "best_score": 0.6, "wait_count": 1}
    resumed, t2 = EarlyStoppingHook("val/acc", patience=4), _trainer()
    resumed.load_state_dict(state)
    assert _feed(resumed, t2, values[3:]) == 3


def test_state_of_another_monitor_is_ignored_with_a_warning() -> None:
    hook = EarlyStoppingHook("val/loss")
    with pytest.warns(UserWarning, match="starting early stopping afresh"):
        hook.load_state_dict({"monitor": "val/acc", "rule": "greater", "best_score": 0.9, "wait_count": 3})
    assert hook.best_score == math.inf and hook.wait_count == 0


@pytest.mark.parametrize("kwargs", [dict(rule="max"), dict(min_delta=-0.1), dict(patience=0), dict(monitor="")])
def test_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        EarlyStoppingHook(**{"monitor": "val/acc", **kwargs})


def test_registered_stateful_and_dispatched() -> None:
    hook = HOOKS.build(dict(type="EarlyStoppingHook", monitor="val/acc", patience=1))
    hooks = HookList([hook])
    assert hooks.stateful() == [hook] and hook.state_key == "EarlyStoppingHook"
    t = _trainer()
    hooks.call("before_train", t)
    hooks.call("after_val_epoch", t, {"val/acc": 0.5})
    hooks.call("after_val_epoch", t, {"val/acc": 0.4})
    assert _stopped(t)


@pytest.mark.parametrize(
    ("monitor", "rule"),
    [
        ("val/Loss", "less"),
        ("val/LOSS_total", "less"),
        ("val/Acc", "greater"),
        ("accuracy/top1", "greater"),
        ("val/mAP", "greater"),
    ],
)
def test_rule_is_inferred_by_mmengine_keys_case_insensitively(monitor: str, rule: str) -> None:
    assert EarlyStoppingHook(monitor).rule == rule


def test_a_falling_capitalised_loss_does_not_stop() -> None:
    hook, t = EarlyStoppingHook("val/Loss", patience=1), _trainer()
    assert _feed(hook, t, [1.0, 0.8, 0.6, 0.4]) is None
    assert hook.best_score == 0.4


def test_a_key_with_no_known_direction_needs_a_rule() -> None:
    with pytest.raises(
        ValueError, match=r"cannot tell whether a higher or a lower 'val/recall' is better.*rule='greater'"
    ):
        EarlyStoppingHook("val/recall")
    assert EarlyStoppingHook("val/recall", rule="greater").rule == "greater"


def test_an_mmengine_key_without_the_val_prefix_is_found(recwarn: pytest.WarningsRecorder) -> None:
    hook, t = EarlyStoppingHook("test/acc", patience=1), _trainer()
    hook.before_train(t)
    hook.after_val_epoch(t, {"val/test/acc": 0.5})
    hook.after_val_epoch(t, {"val/test/acc": 0.4})
    assert _stopped(t) and hook.best_score == 0.5
    assert not [w for w in recwarn if "not among the validation metrics" in str(w.message)]


def test_a_validation_outside_training_stops_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """``trainer.val()`` alone: the reason is logged, no stop is requested (the next ``train()`` is not cut)."""
    hook, t = EarlyStoppingHook("val/acc", patience=1), _trainer()
    with caplog.at_level(logging.INFO, logger="t.early"):
        hook.after_val_epoch(t, {"val/acc": 0.5})
        hook.after_val_epoch(t, {"val/acc": 0.4})
    assert t.train_loop.control.stop_reason is None and not t.train_loop.control.agreement.finish
    assert "(outside training)" in caplog.text
