"""Hook events: order and counts in epoch- and iteration-based runs, priorities, dispatch, state keys."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import classification_set
from torch.utils.data import DataLoader

import trainwright as tw
from trainwright.hooks import EVENTS, HookList
from trainwright.hooks.hook import get_priority


class Recorder(tw.Hook):
    """Records every event it receives (all of them are overridden)."""

    def __init__(self) -> None:
        self.events: list[str] = []


def _make_recorder_method(ev: str):
    def method(self, trainer, *args: Any, **kwargs: Any) -> None:
        self.events.append(ev)

    return method


for _ev in EVENTS:
    setattr(Recorder, _ev, _make_recorder_method(_ev))


def _train_iters(n: int) -> list[str]:
    return ["before_train_iter", "after_train_iter"] * n


def _val(n_batches: int) -> list[str]:
    return [
        "before_val",
        "before_val_epoch",
        *(["before_val_iter", "after_val_iter"] * n_batches),
        "after_val_epoch",
        "after_val",
    ]


class Classifier(tw.BaseModel):
    def __init__(self) -> None:
        super().__init__()
        import torch

        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, y=None, mode="tensor"):
        import torch.nn.functional as F

        logits = self.linear(x)
        return {"loss": F.cross_entropy(logits, y)} if mode == "loss" else logits


def _trainer(factory, train_cfg, rec, **kwargs: Any):
    ds = classification_set(16)  # 4 train batches of 4
    return factory(
        **kwargs,
        model=Classifier(),
        dataset=ds,
        batch_size=4,
        train_cfg=train_cfg,
        custom_hooks=[rec],
        val_dataloader=DataLoader(classification_set(6), batch_size=3),
        val_evaluator=tw.evaluation.Accuracy(),
    )


@pytest.mark.parametrize(
    ("val_interval", "val_begin", "val_epochs"),
    [(1, 1, {1, 2, 3}), (2, 1, {2, 3}), (1, 3, {3}), (2, 2, {2, 3})],
)
def test_epoch_based_order_and_counts(trainer_factory, val_interval, val_begin, val_epochs):
    rec = Recorder()
    t = _trainer(
        trainer_factory, dict(by_epoch=True, max_epochs=3, val_interval=val_interval, val_begin=val_begin), rec
    )
    t.train()
    expected = ["before_run", "before_train"]
    for epoch in (1, 2, 3):
        expected += ["before_train_epoch", *_train_iters(4), "after_train_epoch"]
        if epoch in val_epochs:  # the last epoch is always validated (mmengine semantics)
            expected += _val(2)
    expected += ["after_train", "after_run"]
    assert rec.events == expected


def test_iteration_based_order_and_counts(trainer_factory):
    """max_iters=10 over 4-batch passes, val every 4 iterations from iteration 5: at 8, and at the end (10)."""
    rec = Recorder()
    t = _trainer(trainer_factory, dict(by_epoch=False, max_iters=10, val_interval=4, val_begin=5), rec)
    t.train()
    expected = [
        "before_run",
        "before_train",
        "before_train_epoch",
        *_train_iters(8),
        *_val(2),
        *_train_iters(2),
        *_val(2),
        "after_train_epoch",
        "after_train",
        "after_run",
    ]
    assert rec.events == expected
    assert t.progress.iteration == 10


def test_iteration_based_val_at_interval(trainer_factory):
    rec = Recorder()
    t = _trainer(trainer_factory, dict(by_epoch=False, max_iters=8, val_interval=3), rec)
    t.train()
    expected = [
        "before_run",
        "before_train",
        "before_train_epoch",
        *_train_iters(3),
        *_val(2),
        *_train_iters(3),
        *_val(2),
        *_train_iters(2),
        *_val(2),
        "after_train_epoch",
        "after_train",
        "after_run",
    ]
    assert rec.events == expected


def test_val_and_test_runs_alone(trainer_factory):
    rec = Recorder()
    t = _trainer(trainer_factory, dict(max_epochs=1), rec)
    t.test_loop = None
    metrics = t.val()
    assert set(metrics) == {"val/acc"}
    assert rec.events == ["before_run", *_val(2), "after_run"]


def test_priorities_by_number_and_name():
    order: list[str] = []

    def make(name: str, prio):
        cls = type(name, (tw.Hook,), {"priority": prio, "before_train": lambda self, trainer: order.append(name)})
        return cls()

    hooks = HookList(
        [
            make("low", "LOW"),
            make("ten", 10),
            make("highest", "HIGHEST"),
            make("fifty", 50),
            make("normal", "NORMAL"),
            make("lowest", "lowest"),
        ]
    )
    assert [type(h).__name__ for h in hooks] == ["highest", "ten", "fifty", "normal", "low", "lowest"]
    hooks.call("before_train", None)
    assert order == ["highest", "ten", "fifty", "normal", "low", "lowest"]
    assert get_priority("VERY_HIGH") == 10 and get_priority("BELOW_NORMAL") == 60


@pytest.mark.parametrize("bad", [101, -1, "SUPER"])
def test_bad_priority_is_rejected(bad):
    with pytest.raises(ValueError, match="priority"):
        get_priority(bad)


def test_stock_hooks_run_in_documented_order(trainer_factory):
    """Timer first, logger before the scheduler (the logged lr is the lr used), checkpoint last."""
    t = trainer_factory(default_hooks=dict(checkpoint=dict(interval=1)))
    names = [fn.__self__.__class__.__name__ for fn in t.hooks.calls["after_train_iter"]]
    stock = ["LoggerHook", "ParamSchedulerHook", "CheckpointHook"]
    assert [n for n in names if n in stock] == stock
    # The timer takes its per-step timestamps inside the loop; it starts the clock before anyone else.
    assert t.hooks.calls["before_train_epoch"][0].__self__.__class__.__name__ == "IterTimerHook"


def test_hook_that_overrides_nothing_is_not_dispatched():
    class Nothing(tw.Hook):
        pass

    class OnlyEpoch(tw.Hook):
        def after_train_epoch(self, trainer):
            pass

    hooks = HookList([Nothing(), OnlyEpoch()])
    assert all(len(fns) == 0 for ev, fns in hooks.calls.items() if ev != "after_train_epoch")
    assert len(hooks.calls["after_train_epoch"]) == 1


class Counter(tw.Hook):
    def __init__(self) -> None:
        self.n = 0

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        self.n += 1

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


def test_state_key_collision_raises(trainer_factory):
    with pytest.raises(ValueError, match="state_key.*Counter"):
        trainer_factory(custom_hooks=[Counter(), Counter()])


def test_distinct_state_keys_are_saved_separately(trainer_factory):
    a, b = Counter(), Counter()
    b.state_key = "Counter_b"
    t = trainer_factory(custom_hooks=[a, b])
    t.train()
    b.n = 99
    hooks_state = t.state_dict()["hooks"]
    assert hooks_state["Counter"] == {"n": 10} and hooks_state["Counter_b"] == {"n": 99}


class IterLog(tw.Hook):
    """Records (name, iteration, batch_idx) of every after_train_iter call; declares an interval."""

    def __init__(self, name: str, interval: int, log: list, priority: str = "NORMAL") -> None:
        self.name, self.interval, self.log, self.priority = name, interval, log, priority

    def train_iter_interval(self, trainer) -> int:
        return self.interval

    def after_train_iter(self, trainer, batch_idx, data_batch=None, outputs=None):
        self.log.append((self.name, trainer.progress.iteration, batch_idx))


def test_interval_hooks_are_called_at_their_multiples_and_epoch_ends_only(trainer_factory):
    """An interval-3 hook beside an every-iteration one: called at 3, 6, 9, 12 and the epoch ends (4, 8, 12)."""
    log: list = []
    gated, every = IterLog("gated", 3, log, "HIGH"), IterLog("every", 1, log, "LOW")
    # 4 batches per epoch; the logger's interval (10) would make the gcd 1, so it logs every 6.
    t = _trainer(trainer_factory, dict(by_epoch=True, max_epochs=3), gated, default_hooks=dict(logger=dict(interval=6)))
    t.hooks.add(every)
    t.train()
    assert [it for name, it, _ in log if name == "gated"] == [3, 4, 6, 8, 9, 12]
    assert [it for name, it, _ in log if name == "every"] == list(range(1, 13))
    assert [name for name, it, _ in log if it == 3] == ["gated", "every"]  # priority order where both run
    # After the run every hook is dispatched every iteration again (nothing left gated).
    assert t.hooks.schedule.after_every == t.hooks.calls["after_train_iter"]


def test_each_interval_hook_is_called_exactly_when_due(trainer_factory):
    """Intervals 4 and 6 side by side: each hook sees its own multiples and the pass ends, nothing else."""
    log: list = []
    t = _trainer(trainer_factory, dict(by_epoch=False, max_iters=13), IterLog("a", 4, log))
    t.hooks.add(IterLog("b", 6, log))
    t.train()
    # Iteration-based run over 4-batch passes: the last batch of a pass is iterations 4, 8, 12;
    # the run's last iteration (13) is due for every gated hook too.
    assert [it for name, it, _ in log if name == "a"] == [4, 8, 12, 13]
    assert [it for name, it, _ in log if name == "b"] == [4, 6, 8, 12, 13]


def test_interval_zero_means_never_and_gates_before_train_iter_too(trainer_factory):
    """train_iter_interval 0: no per-iteration calls at all; an interval also gates before_train_iter."""

    class Both(IterLog):
        def before_train_iter(self, trainer, batch_idx, data_batch=None):
            self.log.append((self.name + "-before", trainer.progress.iteration + 1, batch_idx))

    log: list = []
    t = _trainer(trainer_factory, dict(by_epoch=False, max_iters=10), Both("never", 0, log))
    t.hooks.add(Both("five", 5, log))
    t.train()
    assert [e for e in log if e[0].startswith("never")] == []
    # multiples of 5 and the pass ends (4, 8) — before and after the same iterations
    assert [it for name, it, _ in log if name == "five-before"] == [4, 5, 8, 10]
    assert [it for name, it, _ in log if name == "five"] == [4, 5, 8, 10]


def test_resumed_run_calls_interval_hooks_at_the_same_iterations(trainer_factory, tmp_path):
    """The schedule is placed from the iteration a run resumes at, not from 0."""
    log: list = []
    ckpt = dict(checkpoint=dict(by_epoch=False, interval=7))
    t = _trainer(
        trainer_factory,
        dict(by_epoch=False, max_iters=14),
        IterLog("h", 3, log),
        default_hooks=ckpt,
        work_dir=tmp_path / "a",
    )
    t.train()
    full = [it for _, it, _ in log]
    assert full == [3, 4, 6, 8, 9, 12, 14]  # ... and the run's last iteration
    log.clear()
    t2 = _trainer(
        trainer_factory,
        dict(by_epoch=False, max_iters=14),
        IterLog("h", 3, log),
        default_hooks=ckpt,
        work_dir=tmp_path / "b",
    )
    t2.resume_from(tmp_path / "a" / "checkpoints" / "iter_7.pth")
    t2.train()
    assert [it for _, it, _ in log] == [8, 9, 12, 14]


def test_logger_lines_with_gated_dispatch_match_every_interval(trainer_factory, tmp_path):
    """The logger declares its interval: lines at every 3rd iteration and each epoch's last batch, none missing."""
    import json

    t = trainer_factory(default_hooks=dict(logger=dict(interval=3)), train_cfg=dict(by_epoch=True, max_epochs=2))
    t.train()
    t.flush_logs()
    epoch_len = len(t.train_loop.dataloader)
    recs = [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    iters = [r["iter"] for r in recs if r["mode"] == "train"]
    expected = sorted(
        {i for i in range(1, 2 * epoch_len + 1) if ((i - 1) % epoch_len + 1) % 3 == 0 or i % epoch_len == 0}
    )  # within each epoch
    assert iters == expected


@pytest.mark.parametrize("bad", [-2, 1.5])
def test_bad_interval_is_rejected(trainer_factory, bad):
    t = trainer_factory(custom_hooks=[IterLog("x", bad, [])])
    with pytest.raises(ValueError, match="train_iter_interval"):
        t.train()


class Mark(tw.Hook):
    """Appends its name to a shared list at every train epoch end."""

    def __init__(self, name: str = "mark", log: list | None = None) -> None:
        self.name, self.log = name, log if log is not None else []

    def after_train_epoch(self, trainer):
        self.log.append(self.name)


def test_register_hook_and_dict_priority_like_mmengine(trainer_factory):
    """custom_hooks dicts may carry `priority` (mmengine configs do); register_hook adds hooks later."""
    from trainwright.registry import HOOKS

    if "Mark" not in HOOKS:
        HOOKS.register(Mark)
    log: list = []
    t = trainer_factory(
        custom_hooks=[dict(type="Mark", name="low", log=log, priority="LOWEST")],
        train_cfg=dict(by_epoch=True, max_epochs=1),
    )
    added = t.register_hook(Mark("high", log), priority=5)
    from_dict = t.register_hook(dict(type="Mark", name="normal", log=log))
    assert added.priority == 5 and isinstance(from_dict, Mark) and from_dict in t.hooks.hooks
    t.train()
    assert log == ["high", "normal", "low"]
    with pytest.raises(ValueError, match="priority"):
        t.register_hook(Mark(), priority="SOMETIMES")
    with pytest.raises(TypeError, match="must subclass trainwright.Hook"):
        t.register_hook(object())  # type: ignore[arg-type]
