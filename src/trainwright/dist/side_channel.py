"""SideChannel: small per-rank notes in the launcher's key-value store, never through a collective.

A rank stuck in user code or in a collective cannot take part in another collective, so what the ranks tell each other
about a stall (each one's heartbeat) goes through the rendezvous store at ``MASTER_ADDR:MASTER_PORT``, whose server
thread answers whatever the ranks' main threads do.
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

__all__ = ["SideChannel", "open_side_channel"]


class SideChannel:
    """One client of the launcher's store, for one thread: ``publish`` this rank's note, ``read`` another's.

    Keys are ``trainwright/<topic>/<restart>/<rank>`` (an elastic restart starts with empty notes). Every call is
    bounded by the store's timeout and returns quietly when the store is gone (a best effort: the notes only explain a
    stall).

    Args:
        store: A ``torch.distributed.Store`` client.
        topic: The notes' kind (``"beat"``).
    """

    def __init__(self, store: dist.Store, topic: str) -> None:
        self.store = store
        self.prefix = f"trainwright/{topic}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"

    def publish(self, rank: int, note: str) -> bool:
        """Leave ``note`` as ``rank``'s (replacing its previous one); False when the store did not take it."""
        try:
            self.store.set(self.prefix + str(rank), note)
        except Exception:  # noqa: BLE001 - a store that is gone only loses the note
            return False
        return True

    def read(self, rank: int) -> str | None:
        """``rank``'s last note (None: none yet, or the store did not answer)."""
        key = self.prefix + str(rank)
        try:
            if not self.store.check([key]):
                return None
            return self.store.get(key).decode(errors="replace")
        except Exception:  # noqa: BLE001 - see publish
            return None


def open_side_channel(topic: str, timeout_s: float = 2.0) -> SideChannel | None:
    """A new client of the launcher's store (``MASTER_ADDR:MASTER_PORT``), or None when there is none or it does not
    answer within ``timeout_s`` (not launched, one process)."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port or not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    try:
        store = dist.TCPStore(
            host, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
        )
    except Exception:  # noqa: BLE001 - unreachable: no side channel, the local report still stands
        return None
    return SideChannel(store, topic)
