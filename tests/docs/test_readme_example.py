"""The README's 30-second example runs as written and reaches the demo's accuracy bar."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "README.md has no python example"
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)  # noqa: S102 - running our own documentation
    trainer = scope["trainer"]
    assert trainer.val()["val/acc"] >= 0.95
    assert (tmp_path / "work_dirs/readme/checkpoints/latest").is_file()
    trainer.close()
