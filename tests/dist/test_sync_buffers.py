"""SyncBuffersHook: BatchNorm statistics averaged over 2 gloo processes after each epoch (DDP without buffer
    broadcast, FSDP)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from launch import launch

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


@pytest.mark.timeout(180)
def test_batchnorm_statistics_are_the_mean_over_the_ranks_with_the_hook(tmp_path: Path) -> None:
    launch(Path(__file__).with_name("buffers_train.py"), [str(tmp_path / "out")], tmp_path, nproc=2, timeout=150)
    r0, r1 = (torch.load(tmp_path / "out" / f"buffers_rank{r}.pt") for r in (0, 1))
    for strategy in ("ddp", "fsdp"):
        (m0, v0), (m1, v1) = r0[(strategy, False)], r1[(strategy, False)]
        assert not torch.allclose(m0, m1), strategy  # without the hook each rank keeps its own shard's statistics
        # with it: on every rank, the mean of the two ranks' statistics (the training weights are the same)
        for r in (r0, r1):
            mean, var = r[(strategy, True)]
            torch.testing.assert_close(mean, (m0 + m1) / 2, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(var, (v0 + v1) / 2, rtol=1e-5, atol=1e-6)
