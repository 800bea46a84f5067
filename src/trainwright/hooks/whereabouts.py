"""Where the main thread is: its phase (data, forward, backward, step, a hook, validation, save, compile), read off its
stack.

Read by a watcher thread when it needs it (a stall report, a heartbeat, the preemption watchdog), so the training
iteration pays nothing: no phase is written per step.
"""

from __future__ import annotations

import sys
import threading
import traceback
from dataclasses import dataclass, field
from types import FrameType

from trainwright.hooks.hook import EVENTS

__all__ = ["Whereabouts", "main_thread_whereabouts", "phase_of"]

_EVENTS = frozenset(EVENTS)
#: torch.distributed's module functions a rank blocks in while it waits for the others.
_DISPATCH = "trainwright/hooks/dispatch.py"
_DDP = "torch/nn/parallel/distributed.py"
#: DDP's forward-time collectives (the buffers broadcast from rank 0).
_DDP_COLLECTIVES = frozenset({"_sync_buffers", "_sync_module_buffers", "_default_broadcast_coalesced"})
_C10D = "torch/distributed/distributed_c10d.py"


@dataclass
class Whereabouts:
    """What a thread is doing, as read from its stack.

    Attributes:
        phase: ``"data"``, ``"forward"``, ``"backward"``, ``"step"``, ``"hook Class.event"``, ``"validation"`` (a
            validation or test pass), ``"save"``, ``"compile"``, ``"between steps"`` (the train loop itself, e.g. its
            agreement point) or ``"other"`` (outside an iteration: building, between runs).
        collective: The torch.distributed function it is inside (``"all_gather"``, ``"barrier"``), None when none.
        top: The innermost frames, innermost last, as ``"file:line in function"``.
    """

    phase: str = "other"
    collective: str | None = None
    top: list[str] = field(default_factory=list)


def _step_phase(name: str, filename: str) -> str | None:
    """The phase a frame of the step path marks (None: not such a frame)."""
    if name == "train_step":
        return "forward"
    if name == "backward":
        return "backward"
    if name in ("step", "optimizer_step") and ("trainwright" in filename or "torch/optim" in filename):
        return "step"
    return None


def phase_of(frame: FrameType | None, top: int = 4) -> Whereabouts:
    """The :class:`Whereabouts` of a stack whose innermost frame is ``frame``.

    The stack is read from the outermost frame in: the last marker met wins (a hook inside a validation is that hook),
    except that once a batch fetch, a compilation or a checkpoint save is met, everything deeper belongs to it.
    """
    frames: list[FrameType] = []
    f = frame
    while f is not None:
        frames.append(f)
        f = f.f_back
    frames.reverse()
    phase, collective = "other", None
    settled = False
    for fr in frames:
        code = fr.f_code
        name, filename = code.co_name, code.co_filename.replace("\\", "/")
        if collective is None:
            if filename.endswith(_C10D) and not name.startswith("_"):
                collective = name
            elif filename.endswith(_DDP) and name in _DDP_COLLECTIVES:
                collective = "DDP's buffer broadcast"
        if settled:
            continue
        if "torch/_dynamo/" in filename or "torch/_inductor/" in filename:
            phase, settled = "compile", True
        elif "torch/utils/data/" in filename or "trainwright/data/" in filename:
            phase, settled = "data", True
        elif name == "save" and filename.endswith("trainwright/checkpoint/manager.py"):
            phase, settled = "save", True
        elif filename.endswith("trainwright/loops/eval_loop.py") and name == "run_pass":
            phase = "validation"
        elif filename.endswith("trainwright/loops/train_loop.py") and name == "_run_iters":
            phase = "iteration"
        elif name in _EVENTS and not filename.endswith(_DISPATCH) and "trainwright/loops/" not in filename:
            qual = getattr(code, "co_qualname", name)
            phase = f"hook {qual}"
        elif phase in ("iteration", "forward", "backward"):
            phase = _step_phase(name, filename) or phase
    if phase == "iteration":
        phase = "between steps"  # in the train loop itself: the loop's agreement point, the loader's next()
    summary = traceback.extract_stack(frame, limit=top) if frame is not None else []
    shown = [
        f"{_short(s.filename)}:{s.lineno} in {s.name}" + (f": {s.line.strip()}" if s.line else "") for s in summary
    ]
    return Whereabouts(phase=phase, collective=collective, top=shown)


def _short(filename: str) -> str:
    """``.../trainwright/hooks/x.py`` and ``.../torch/nn/y.py`` from their package on; another file by its name."""
    path = filename.replace("\\", "/")
    for package in ("/trainwright/", "/torch/"):
        if package in path:
            return package[1:] + path.rsplit(package, 1)[1]
    return path.rsplit("/", 1)[-1]


def main_thread_whereabouts(top: int = 4) -> Whereabouts:
    """Where the process's main thread is now (see :func:`phase_of`)."""
    main = threading.main_thread().ident
    frame = sys._current_frames().get(main) if main is not None else None  # noqa: SLF001 - the documented way
    return phase_of(frame, top)
