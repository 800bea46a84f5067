"""benchmarks/gpt.py runs with tiny settings and checks what it claims: every side ends with the same loss.

A guard against bit-rot, not a speed test (the numbers are measured by hand, see docs/performance.md).
The compiled sides use the ``aot_eager`` backend: the same tracing (dynamo, AOTAutograd, the compiled
optimizer step) without inductor's code generation, which took most of this test's minute on CI
(inductor itself is exercised by tests/model/test_compile_regions.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpt_benchmark_runs_and_every_side_ends_with_the_same_loss(tmp_path: Path) -> None:
    out = tmp_path / "gpt.json"
    args = [
        "benchmarks/gpt.py",
        "--steps",
        "4",
        "--warmup",
        "2",
        "--rounds",
        "1",
        "--dim",
        "16",
        "--depth",
        "1",
        "--heads",
        "2",
        "--block-size",
        "8",
        "--batch-size",
        "2",
        "--backend",
        "aot_eager",
        "--json",
        str(out),
    ]
    env = {**os.environ, "TMPDIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    res = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr[-6000:]}"
    result = json.loads(out.read_text())
    assert [r["row"] for r in result["rows"]] == ["eager", "compiled", "vs eager"]
    for r in result["rows"]:
        assert r["same_final_loss"], r
        assert r["ratio"] == pytest.approx(r["trainwright_s"] / r["reference_s"]) and r["tokens_per_s_trainwright"] > 0
    # eager trainwright and the eager hand-written loop do the same arithmetic: the same loss to the last bit
    assert result["rows"][0]["final_loss_trainwright"] == result["rows"][0]["final_loss_reference"]
    assert set(result["compile_s"]) == {"tw_compiled", "raw_compiled"}
    assert "compile time tw_compiled" in res.stdout
