"""Rank 0's stall line from the ranks' heartbeats: the rank behind, a rank gone silent, ranks in other collectives."""

from __future__ import annotations

from trainwright.hooks.heartbeat import Beat, behind_summary

NOW = 1000.0


def beat(rank: int, iteration: int, phase: str, collective: str | None = None, age: float = 1.0) -> Beat:
    top = ["f.py:1 in g: h()"]
    return Beat(rank, iteration, f"at iteration {iteration}", 0, phase, collective, top, NOW - age, 9.0)


def test_the_rank_not_in_a_collective_is_behind_and_the_others_wait() -> None:
    beats = {
        0: beat(0, 4, "backward", "DDP's gradient all-reduce (inside backward)"),
        1: beat(1, 4, "data"),
        2: beat(2, 4, "backward", "DDP's gradient all-reduce (inside backward)"),
    }
    line = behind_summary(beats, 3, NOW, stale_s=5.0)
    assert line.startswith("rank 1 is behind: at iteration 4, in data, no iteration finished for 9 s; top of its stack")
    assert "rank 0 waits in DDP's gradient all-reduce (inside backward)" in line
    assert "rank 2 waits in DDP's gradient all-reduce" in line


def test_a_silent_rank_is_named_first() -> None:
    beats = {0: beat(0, 7, "step", "all_gather"), 1: beat(1, 6, "forward", age=60.0), 2: None}
    line = behind_summary(beats, 3, NOW, stale_s=5.0)
    assert line.startswith("rank 2 sent no heartbeat; rank 1 sent none for 60 s (its process may be frozen or gone")
    assert "rank 0 waits in all_gather (at iteration 7, in step)" in line


def test_every_rank_in_a_collective_at_another_iteration_names_the_one_behind() -> None:
    beats = {0: beat(0, 10, "step", "all_gather"), 1: beat(1, 9, "validation", "barrier")}
    line = behind_summary(beats, 2, NOW, stale_s=5.0)
    assert line.startswith("rank 1 is behind: at iteration 9, in validation (waiting in barrier)"), line
    assert "rank 0 waits in all_gather" in line
    same = {0: beat(0, 9, "step", "all_gather"), 1: beat(1, 9, "validation", "barrier")}
    line = behind_summary(same, 2, NOW, stale_s=5.0)
    assert "rank 0 waits in all_gather" in line and "rank 1 waits in barrier" in line
    assert "no rank is behind the others" in line
