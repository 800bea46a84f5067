"""ProfilerHook: Chrome traces of the scheduled iterations in the run folder; not called outside its window."""

from __future__ import annotations

import importlib.util
import json

import pytest

from trainwright.hooks import ProfilerHook


def _steps(path) -> list[str]:
    events = json.loads(path.read_text())["traceEvents"]
    assert len(events) > 10
    return sorted(
        {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")},
        key=lambda n: int(n.split("#")[1]),
    )


def test_trace_of_the_active_iterations_is_written_as_json(trainer_factory):
    prof = ProfilerHook(wait=1, warmup=1, active=2)
    t = trainer_factory(custom_hooks=[prof], train_cfg=dict(max_epochs=2))  # 10 iterations per epoch
    t.train()
    path = t.run_dir / "profiler" / "trace_rank0_iter3-4.json"
    assert prof.traces == [path] and path.exists()
    assert _steps(path) == ["ProfilerStep#2", "ProfilerStep#3"]  # the profiler's steps 2 and 3 are iterations 3 and 4
    # not called outside its window: iterations 1..4 of 20
    rows = {(r.hook, r.event): r.calls for r in t.hooks.report()}
    assert rows[("ProfilerHook", "after_train_iter")] == 4 and rows[("ProfilerHook", "before_train_iter")] == 4


@pytest.mark.filterwarnings(
    "ignore:Profiler won't be using warmup:UserWarning",
    "ignore:.*Profiler clears events at the end of each cycle:UserWarning",
)  # torch's own notes on the schedule under test
def test_repeat_and_skip_first_write_one_trace_per_cycle(trainer_factory):
    prof = ProfilerHook(wait=1, warmup=0, active=1, repeat=2, skip_first=3)
    t = trainer_factory(custom_hooks=[prof], train_cfg=dict(max_epochs=2))
    t.train()
    # skip 1-3; cycle 1: wait 4, record 5; cycle 2: wait 6, record 7
    assert [p.name for p in prof.traces] == ["trace_rank0_iter5-5.json", "trace_rank0_iter7-7.json"]
    rows = {(r.hook, r.event): r.calls for r in t.hooks.report()}
    assert rows[("ProfilerHook", "after_train_iter")] == 4  # iterations 4..7


def test_training_ending_inside_the_window_writes_what_was_recorded(trainer_factory):
    prof = ProfilerHook(wait=0, warmup=1, active=5)
    t = trainer_factory(custom_hooks=[prof], train_cfg=dict(by_epoch=False, max_iters=4))
    t.train()
    assert [p.name for p in prof.traces] == ["trace_rank0_iter2-4.json"]
    assert _steps(prof.traces[0]) == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs tensorboard")
def test_tensorboard_plugin_format(trainer_factory, tmp_path):
    prof = ProfilerHook(wait=0, warmup=1, active=1, tensorboard=True, out_dir=tmp_path / "prof")
    t = trainer_factory(custom_hooks=[prof])
    t.train()
    tb = list((tmp_path / "prof" / "tensorboard").glob("rank0.*.pt.trace.json"))
    assert len(tb) == 1 and json.loads(tb[0].read_text())["traceEvents"]
    assert (tmp_path / "prof" / "trace_rank0_iter2-2.json").exists()


@pytest.mark.filterwarnings(
    "ignore:Profiler won't be using warmup:UserWarning",
    "ignore:.*Profiler clears events at the end of each cycle:UserWarning",
)  # torch's own notes on the schedule under test
def test_configured_by_dict_from_the_registry(trainer_factory):
    t = trainer_factory(custom_hooks=[dict(type="ProfilerHook", wait=0, warmup=0, active=1)])
    t.train()
    assert (t.run_dir / "profiler" / "trace_rank0_iter1-1.json").exists()


@pytest.mark.parametrize(
    "kwargs, match", [(dict(active=0), "active"), (dict(wait=-1), "wait"), (dict(activities=["tpu"]), "activity")]
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProfilerHook(**kwargs)
