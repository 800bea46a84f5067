"""``trainwright env``: what a bug report needs to know about the environment."""

from __future__ import annotations

import importlib.metadata
import platform
import sys

import torch

from trainwright.dist import available_backends, detect_launcher
from trainwright.version import __version__

#: Optional packages and the extra that installs each.
EXTRAS = {
    "numpy": "(core)",
    "safetensors": "(core)",
    "matplotlib": "(core)",
    "rich": "(core)",
    "pyyaml": "yaml",
    "scikit-learn": "demo",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "torchmetrics": "torchmetrics",
    "deepspeed": "deepspeed",
    "torchao": "float8",
    "fsspec": "remote storage",
    "s3fs": "remote storage",
    "optuna": "sweeps",
}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def collect_env_info() -> str:
    """One ``name: value`` line per fact: trainwright, Python, platform, torch, CUDA, devices, backends, launcher,
    extras."""
    lines = [
        f"trainwright: {__version__}",
        f"Python: {sys.version.split()[0]} ({sys.executable})",
        f"Platform: {platform.platform()}",
        f"torch: {torch.__version__}",
        f"CUDA available: {torch.cuda.is_available()}",
    ]
    if torch.cuda.is_available():
        lines.append(f"CUDA: {torch.version.cuda}, cuDNN: {torch.backends.cudnn.version()}")
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            lines.append(
                f"  cuda:{i}: {props.name}, {props.total_memory / 2**30:.1f} GiB, capability "
                f"{props.major}.{props.minor}"
            )
        lines.append(f"bf16 supported: {torch.cuda.is_bf16_supported()}")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        lines.append("MPS available: True")
    lines.append(f"CPU threads: {torch.get_num_threads()}")
    backends = available_backends()
    lines.append(
        "Distributed backends: "
        + (", ".join(f"{k}={'yes' if v else 'no'}" for k, v in backends.items()) or "torch.distributed not available")
    )
    lines.append(f"Launcher detected: {detect_launcher()}")
    lines.append("Packages: " + ", ".join(f"{d} {_version(d)} [{extra}]" for d, extra in EXTRAS.items()))
    return "\n".join(lines)
