"""A Hugging Face stream (local JSON-lines shards, 2 loader workers) on 2 gloo processes, split by rank: killed with
SIGKILL mid-pass and resumed, each rank trains the samples and ends with the weights of the uninterrupted run, and the
resumed run reads no sample twice (a replay would read the samples before the kill again)."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from launch import launch
from streams import write_shards

SCRIPT = Path(__file__).with_name("stream_ranks_train.py")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
SIZES = [5, 7] * 4  # rank 0 reads the shards of 5 samples, rank 1 those of 7: their positions differ
# 2 shards per loader worker, 2 workers, batches of 4: rank 0's part ends after 6 iterations, rank 1's after 8. The run
# stops there, inside the pass: each sample the resumed run reads is read once (the next pass, which Hugging Face
# assigns other shards, would read samples again; the uneven end itself: test_stream_split.py)
MAX_ITERS, KILL_AT = 6, 3


def _trained(work: Path, tag: str, rank: int) -> dict[int, list[int]]:
    lines = (work / f"trained-{tag}-rank{rank}.jsonl").read_text().splitlines()
    return {r["it"]: r["ids"] for r in map(json.loads, lines)}


@pytest.mark.timeout(400)
def test_killed_and_resumed_stream_on_two_processes_trains_as_the_uninterrupted_run(tmp_path: Path) -> None:
    full, cut = tmp_path / "full", tmp_path / "cut"
    for work in (full, cut):
        write_shards(work / "shards", shards=8, per_shard=SIZES)
        (tmp_path / f"{work.name}_tmp").mkdir()  # each launch its own TMPDIR and logs
    with ThreadPoolExecutor(1) as beside:  # the uninterrupted run trains while the killed one and its resume do
        uninterrupted = beside.submit(
            launch, SCRIPT, [str(full), str(MAX_ITERS), "0", "a"], tmp_path / "full_tmp", nproc=2, timeout=180
        )
        args = [str(cut), str(MAX_ITERS), str(KILL_AT)]
        killed = launch(SCRIPT, [*args, "a"], tmp_path / "cut_tmp", nproc=2, timeout=180, check=False)
        assert killed.returncode != 0
        launch(SCRIPT, [*args, "b", "--resume"], tmp_path / "cut_tmp", nproc=2, timeout=180)
        uninterrupted.result()
    parts = []
    for rank in range(2):
        reference = _trained(full, "a", rank)
        before = {it: ids for it, ids in _trained(cut, "a", rank).items() if it <= KILL_AT}
        after = _trained(cut, "b", rank)
        assert min(after) == KILL_AT + 1
        assert {**before, **after} == reference, (rank, before, after, reference)
        parts.append({i for it in range(1, MAX_ITERS + 1) for i in reference[it]})
        reads = Counter(int(line) for line in (cut / f"reads-b-rank{rank}.txt").read_text().split())
        assert max(reads.values()) == 1, reads
        assert not {i for it in range(1, KILL_AT + 1) for i in reference[it]} & set(reads)  # no replay up to the kill
        assert {i for it in range(KILL_AT + 1, MAX_ITERS + 1) for i in reference[it]} <= set(reads)
    assert parts[0].isdisjoint(parts[1])  # each rank its own part
    a, b = torch.load(full / "weights-a.pt"), torch.load(cut / "weights-b.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
