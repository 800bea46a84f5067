"""Only trainwright/dist/ and trainwright/strategies/ may import torch.distributed (docs/architecture.md, "Layers").

import-linter checks the layers (`lint-imports`, run in CI); external subpackages such as
torch.distributed are outside its reach, so this test reads the sources' import statements.
"""

from __future__ import annotations

import ast
from pathlib import Path

import trainwright

ALLOWED = {"dist", "strategies"}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_only_dist_and_strategies_import_torch_distributed() -> None:
    root = Path(trainwright.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        top = path.relative_to(root).parts[0]
        if top in ALLOWED:
            continue
        if any(n == "torch.distributed" or n.startswith("torch.distributed.") for n in _imports(path)):
            offenders.append(str(path.relative_to(root)))
    assert not offenders, (
        f"torch.distributed imported outside dist/ and strategies/: {offenders}; use trainwright.dist helpers or a "
        "Strategy capability"
    )
