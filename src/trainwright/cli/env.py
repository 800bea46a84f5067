"""``trainwright env``: what a bug report needs to know about the environment.

The default report reads torch's build facts from its files (``torch/version.py``, the build's
CMake configuration) and the GPUs from ``nvidia-smi``, without importing torch (~2 s saved);
``--full`` imports torch and asks it (devices, CUDA / MPS availability, threads, backends).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainwright.utils.launcher import detect_launcher
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
#: The ``torch.distributed`` backends a build may have, as ``available_backends`` names them.
BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
_FULL = "trainwright env --full asks torch"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def collect_env_info(full: bool = False) -> str:
    """One ``name: value`` line per fact: trainwright, Python, platform, torch, CUDA, devices, backends, launcher,
    extras.

    Args:
        full: Import torch and ask it (CUDA / MPS availability, devices, threads, backends); by
            default these come from torch's files and ``nvidia-smi``, in a fraction of a second.
    """
    lines = [
        f"trainwright: {__version__}",
        f"Python: {sys.version.split()[0]} ({sys.executable})",
        f"Platform: {platform.platform()}",
    ]
    lines += _torch_lines() if full else _build_lines()
    lines.append(f"Launcher detected: {detect_launcher()}")
    lines.append("Packages: " + ", ".join(f"{d} {_version(d)} [{extra}]" for d, extra in EXTRAS.items()))
    return "\n".join(lines)


# --------------------------------------------------------------------------- --full: torch's answers


def _torch_lines() -> list[str]:
    import torch

    from trainwright.dist import available_backends

    lines = [f"torch: {torch.__version__}", f"CUDA available: {torch.cuda.is_available()}"]
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
    return lines


# --------------------------------------------------------------------------- the default: torch's files


def _build_lines() -> list[str]:
    """The same facts as :func:`_torch_lines`, from torch's build files and ``nvidia-smi``; torch is not imported."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return ["torch: not installed"]
    root = Path(spec.origin).parent
    version = _torch_version_file(root)
    cuda, hip = version.get("cuda"), version.get("hip")
    lines = [f"torch: {version.get('__version__', 'unknown (no torch/version.py)')}"]
    if cuda is None and hip is None:
        lines.append("CUDA available: False (a CPU-only build of torch)")
    else:
        lines += _gpu_lines(cuda, hip)
    if sys.platform == "darwin" and platform.machine() == "arm64":
        lines.append(f"MPS: an Apple-silicon Mac ({_FULL} whether MPS is available)")
    lines.append(f"CPU cores: {_usable_cpus()} usable of {os.cpu_count()}{_thread_settings()}")
    lines.append("Distributed backends: " + _built_backends(root))
    return lines


def _torch_version_file(root: Path) -> dict[str, Any]:
    """The names ``torch/version.py`` defines (``__version__``, ``cuda``, ``hip``, ``git_version``...)."""
    names: dict[str, Any] = {}
    try:
        code = (root / "version.py").read_text(encoding="utf-8")
        exec(compile(code, str(root / "version.py"), "exec"), names)  # noqa: S102 - torch's own generated file
    except (OSError, SyntaxError, ImportError):
        return {}
    return names


def _gpu_lines(cuda: str | None, hip: str | None) -> list[str]:
    build = f"CUDA {cuda}" if cuda is not None else f"ROCm/HIP {hip}"
    cudnn = [f"{d} {_version(d)}" for d in ("nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "nvidia-cudnn-cu11") if _has(d)]
    lines = [f"CUDA: {build} build, cuDNN: {', '.join(cudnn) or 'no cuDNN wheel installed (may be bundled)'}"]
    gpus = _nvidia_smi() if cuda is not None else None
    if gpus is None:
        lines.insert(0, f"CUDA available: unknown without importing torch ({_FULL})")
        return lines
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f" (nvidia-smi; {_FULL}" + (f"; CUDA_VISIBLE_DEVICES={visible!r} limits torch's view" if visible else "")
    lines.insert(0, f"CUDA available: {bool(gpus)}{seen})")
    caps = []
    for i, (name, mib, cap) in enumerate(gpus):
        lines.append(f"  cuda:{i}: {name}, {mib / 1024:.1f} GiB" + (f", capability {cap}" if cap else ""))
        caps.append(cap)
    if gpus and all(caps):
        lines.append(f"bf16 supported: {all(float(c) >= 8.0 for c in caps)} (compute capability >= 8.0)")
    return lines


def _has(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _nvidia_smi() -> list[tuple[str, float, str]] | None:
    """``(name, MiB, compute capability)`` of each GPU ``nvidia-smi`` lists; None without a working ``nvidia-smi``."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    for fields in ("name,memory.total,compute_cap", "name,memory.total"):  # compute_cap: drivers from 2021 on
        try:
            out = subprocess.run(
                [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        gpus = []
        for row in out.strip().splitlines():
            parts = [p.strip() for p in row.split(",")]
            try:
                gpus.append((parts[0], float(parts[1]), parts[2] if len(parts) > 2 else ""))
            except (IndexError, ValueError):
                return None
        return gpus
    return None


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _thread_settings() -> str:
    set_ = [f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ]
    return f" ({', '.join(set_)}; {_FULL} for its threads)" if set_ else f" ({_FULL} for its threads)"


def _built_backends(root: Path) -> str:
    """The backends torch was built with, from the compile definitions in its CMake files (``USE_C10D_GLOO``...)."""
    config = root / "share" / "cmake" / "Caffe2" / "Caffe2Targets.cmake"
    try:
        text = config.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"unknown without importing torch ({_FULL})"
    if re.search(r"\bUSE_DISTRIBUTED\b", text) is None:
        return "torch.distributed not available"
    defined = set(re.findall(r"\bUSE_C10D_([A-Z]+)\b", text))
    built = ", ".join(f"{b}={'yes' if b.upper() in defined else 'no'}" for b in BACKENDS)
    return f"{built} (built in; {_FULL} which work here)"
