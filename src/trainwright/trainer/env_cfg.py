"""mmengine's ``env_cfg``: cudnn benchmark, the multiprocessing start method, the process group's backend and timeout,
the open-files limit.

``env_cfg=dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method="fork", opencv_num_threads=0),
dist_cfg=dict(backend="nccl", timeout=1800), resource_limit=4096)`` as mmengine's Runner takes it. The process-group
settings apply to a multi-process strategy; a ``backend`` the device cannot use (NCCL without
CUDA) falls back to gloo with a warning, so a runtime config written for GPUs also runs on CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainwright.registry import check_keys
from trainwright.strategies.base import Strategy

ENV_CFG_KEYS = frozenset({"cudnn_benchmark", "mp_cfg", "dist_cfg", "resource_limit"})
_MP_KEYS = frozenset({"mp_start_method", "opencv_num_threads"})


def apply_env_cfg(strategy: Strategy, env_cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """Apply ``env_cfg``'s process-wide settings; return the keyword arguments of ``strategy.setup_env`` it implies.

    Raises:
        KeyError: an unknown key (with the close match).
    """
    cfg = dict(env_cfg or {})
    check_keys("env_cfg", cfg, ENV_CFG_KEYS)
    mp_cfg = dict(cfg.get("mp_cfg") or {})
    check_keys("env_cfg.mp_cfg", mp_cfg, _MP_KEYS)
    if mp_cfg.get("mp_start_method") is not None:
        import torch.multiprocessing as mp

        method = mp_cfg["mp_start_method"]
        if mp.get_start_method(allow_none=True) != method:
            mp.set_start_method(
                method, force=True
            )  # as mmengine: the DataLoader workers of this process start this way
    if mp_cfg.get("opencv_num_threads") is not None:
        try:
            import cv2  # type: ignore[import-not-found]
        except ImportError:
            pass  # nothing to configure without OpenCV
        else:
            cv2.setNumThreads(int(mp_cfg["opencv_num_threads"]))
    if cfg.get("resource_limit") is not None:
        _raise_open_files(int(cfg["resource_limit"]))
    dist_cfg = dict(cfg.get("dist_cfg") or {})
    backend = dist_cfg.pop("backend", None)
    timeout = dist_cfg.pop("timeout", None)
    strategy.use_process_group(None if backend is None else str(backend), None if timeout is None else float(timeout))
    out: dict[str, Any] = {"cudnn_benchmark": bool(cfg.get("cudnn_benchmark", False))}
    if dist_cfg:
        out["dist_cfg"] = dist_cfg  # further init_process_group arguments (init_method, ...)
    return out


def _raise_open_files(limit: int) -> None:
    """mmengine's ``resource_limit``: the soft limit of open files raised to ``limit`` (never lowered, at most the
    hard limit)."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(limit, soft) if hard == resource.RLIM_INFINITY else min(max(limit, soft), hard)
    if wanted != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
