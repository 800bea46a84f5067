"""Beat: one rank's heartbeat (its position, its phase, the top of its stack) and the stall summary made from them.

Each rank's :class:`~trainwright.hooks.stall.StallHook` publishes its beat through the strategy's side channel (the
launcher's store, never a collective); on a stall rank 0 reads every rank's and logs which rank is behind, where, and
which collective the others wait in (:func:`behind_summary`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

__all__ = ["Beat", "behind_summary"]


@dataclass
class Beat:
    """One rank's heartbeat.

    Attributes:
        rank: The rank that sent it.
        iteration: Training iterations it has finished.
        where: Its position as its log lines number it (``"at epoch 1, iteration 2"``).
        eval_iters: Validation / test iterations it has finished in this run call.
        phase: What its main thread does (:class:`~trainwright.hooks.whereabouts.Whereabouts` ``phase``).
        collective: The torch.distributed call its main thread is inside, or the strategy's collective inside backward
            (DDP's gradient all-reduce) when it is in backward; None: none.
        top: The innermost frames of its main thread's stack (innermost last).
        time: When it was sent (seconds since the epoch, the sender's clock).
        idle_s: Seconds since its last finished iteration.
    """

    rank: int
    iteration: int
    where: str
    eval_iters: int
    phase: str
    collective: str | None
    top: list[str] = field(default_factory=list)
    time: float = 0.0
    idle_s: float = 0.0

    def dumps(self) -> str:
        """As one JSON line (what goes into the store)."""
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, text: str) -> Beat | None:
        """A beat read back (None when ``text`` is not one)."""
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError):
            return None

    @property
    def waits(self) -> bool:
        """Whether it waits for the other ranks (inside a collective)."""
        return self.collective is not None

    def position(self) -> str:
        """``"at iteration 2, in hook Stuck.before_train_iter"``."""
        return f"{self.where}, in {self.phase}"


def _frames(beat: Beat) -> str:
    return " <- ".join(reversed(beat.top[-3:])) if beat.top else "no stack"


def behind_summary(beats: dict[int, Beat | None], world_size: int, now: float, stale_s: float) -> str:
    """The rank-0 line of a stall: which rank is behind, where, and which collective the others wait in.

    Behind: the ranks with the fewest finished iterations (validation iterations next) that wait in no collective;
    when every rank waits in one, the ranks with the fewest iterations (the others wait in different collectives: each
    is named). A rank whose beat is missing or older than ``stale_s`` is named first: its process may be frozen or gone.
    """
    missing = [r for r in range(world_size) if beats.get(r) is None]
    known = {r: b for r, b in beats.items() if b is not None}
    stale = sorted(r for r, b in known.items() if now - b.time > stale_s)
    parts: list[str] = []
    if missing or stale:
        said = [f"rank {r} sent no heartbeat" for r in missing]
        said += [
            f"rank {r} sent none for {now - known[r].time:.0f} s (its process may be frozen or gone; its last: "
            f"{known[r].position()})"
            for r in stale
        ]
        parts.append("; ".join(said))
    live = {r: b for r, b in known.items() if r not in stale}
    if live:
        least = min((b.iteration, b.eval_iters) for b in live.values())
        lowest = {r: b for r, b in live.items() if (b.iteration, b.eval_iters) == least}
        behind = {r: b for r, b in lowest.items() if not b.waits} or (lowest if len(lowest) < len(live) else {})
        for r, b in sorted(behind.items()):
            parts.append(
                f"rank {r} is behind: {b.position()}"
                + (f" (waiting in {b.collective})" if b.waits else "")
                + f", no iteration finished for {b.idle_s:.0f} s; top of its stack: {_frames(b)}"
            )
        waiting = {r: b for r, b in live.items() if r not in behind and b.waits}
        for r, b in sorted(waiting.items()):
            parts.append(f"rank {r} waits in {b.collective} ({b.position()})")
        if not behind and not missing and not stale:
            parts.append("no rank is behind the others (every rank waits in a collective, or all are slow)")
    return "; ".join(parts)
