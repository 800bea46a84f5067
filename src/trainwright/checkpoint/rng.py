"""Random number generator states, stored so that a checkpoint loads with ``weights_only=True``.

Exact resume needs every generator a run draws from: Python's ``random`` (augmentations),
NumPy's global generator (data pipelines), torch's CPU generator and each CUDA device's.
The states are kept as tensors and plain Python values only (no NumPy arrays, no
arbitrary objects), so the safe loader accepts them.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch


def get_rng_state() -> dict[str, Any]:
    """Capture the state of every global random number generator of this process.

    Returns:
        ``{"python": ..., "numpy": ..., "torch": Tensor, "torch_cuda": [Tensor, ...]}``;
        ``"torch_cuda"`` is present only when CUDA is available (one state per device).
    """
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "bit_generator": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the generators captured by :func:`get_rng_state`.

    Entries that are absent are left alone. CUDA states are skipped, with a warning, when
    CUDA is unavailable here; when the device count differs, the devices both runs have
    are restored and a warning says so.
    """
    if "python" in state:
        py = state["python"]
        random.setstate((int(py["version"]), tuple(int(x) for x in py["state"]), py["gauss_next"]))
    if "numpy" in state:
        npst = state["numpy"]
        keys = np.asarray(torch.as_tensor(npst["keys"]).numpy(), dtype=np.uint32)
        np.random.set_state(
            (npst["bit_generator"], keys, int(npst["pos"]), int(npst["has_gauss"]), float(npst["cached_gaussian"]))
        )
    if "torch" in state:
        torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    cuda_states = list(state.get("torch_cuda") or [])
    if not cuda_states:
        return
    if not torch.cuda.is_available():
        warnings.warn(
            f"The checkpoint holds RNG states for {len(cuda_states)} CUDA device(s) but CUDA is not "
            "available here; they are ignored, so GPU random numbers will differ from the original run.",
            stacklevel=2,
        )
        return
    count = torch.cuda.device_count()
    if count != len(cuda_states):
        warnings.warn(
            f"The checkpoint holds RNG states for {len(cuda_states)} CUDA device(s), this process sees "
            f"{count}; restoring the first {min(count, len(cuda_states))}.",
            stacklevel=2,
        )
    for device, cuda_state in enumerate(cuda_states[:count]):
        torch.cuda.set_rng_state(torch.as_tensor(cuda_state, dtype=torch.uint8).cpu(), device)
