"""When is a job over, for a viewer or a collector that did not start it (``attach``,
``serve``)? When every rank of its world said Bye. (A rank killed without a word never says
it; then the collector's own end, or the person, decides.)"""

from __future__ import annotations

import threading
import time

from zeroscope.agent.schema import Bye, Hello, Message
from zeroscope.state import ClusterState


def all_ranks_said_bye(state: ClusterState) -> bool:
    """Every rank of the world (as the Hellos tell its size) said Bye."""
    ranks = state.ranks.values()
    return bool(state.ranks) and len(state.ranks) >= state.world_size and all(r.bye for r in ranks)


class ByeCounter:
    """A collector listener (any thread) that knows when the job's ranks have all said Bye,
    without keeping a ClusterState."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._world = 0
        self._hello: set[int] = set()
        self._bye: dict[int, int] = {}
        self._changed = time.monotonic()

    def see(self, message: Message) -> None:
        if isinstance(message, Hello):
            with self._lock:
                self._world = max(self._world, message.world_size)
                self._hello.add(message.rank)
                self._bye.pop(message.rank, None)  # a restarted rank says Hello again
                self._changed = time.monotonic()
        elif isinstance(message, Bye):
            with self._lock:
                self._bye[message.rank] = message.exit_code
                self._changed = time.monotonic()

    def over(self) -> tuple[bool, bool, float]:
        """(every rank said Bye, all of them with exit code 0, seconds since the last Hello or
        Bye)."""
        with self._lock:
            ranks = self._hello | set(self._bye)
            done = bool(ranks) and len(ranks) >= self._world and ranks <= set(self._bye)
            clean = done and not any(self._bye.values())
            return done, clean, time.monotonic() - self._changed
