"""The alerts' per-rank conditions, kept as messages arrive instead of found by a pass over every
rank each frame.

The alerts (state/alerts.py) are evaluated every frame. At 16,384 ranks one pass over the
ranks' states (low memory, silent, exited with an error, ended, dropping) cost 9-15 ms of a
frame on the shared 2-core box: the RankStates lie scattered in memory, so even C-level passes
cost ~2 ms each. A rank's conditions change only when one of its messages arrives, so
ClusterState's ingest tells this book what changed (a receive time, a host sample, a Bye, a
drop count) and the alerts read sets of a few ranks.

Silence is the one condition that changes with the clock and not with a message: a rank is
silent at ``now`` when ``now - last_seen > silent_s``. The book keeps the ranks without a Bye
in the order their last-seen time last moved; while those times arrive in order (live: the
receiver's clock; replay: the newest instant seen so far, both never going back) the oldest
come first, and a frame reads only the silent ones and the first that is not. A time that
goes back (a caller's own clock) marks the order unsorted, and the next read sorts it once.
"""

from __future__ import annotations

from operator import itemgetter

from zeroscope.agent.schema import Bye, HostSample

from .alerts import interrupted

_SEEN = itemgetter(1)


def low_memory(host: HostSample, headroom_min: float, host_available_min: int) -> bool:
    """Device headroom under ``headroom_min`` of its total, or host memory available under
    ``host_available_min`` bytes (AlertRules' two memory thresholds)."""
    total, used = host.gpu_mem_total_bytes, host.gpu_mem_used_bytes
    if total and used is not None and (total - used) / total < headroom_min:
        return True
    available = host.mem_available_bytes
    return available is not None and available < host_available_min


class RankConditions:
    """Which ranks are low on memory, exited with an error, said Bye, dropped messages, and
    when each rank without a Bye was last heard from. Fed by ClusterState's ingest only
    (nothing else writes the RankState fields these mirror)."""

    __slots__ = ("_memory", "_seen", "_sorted", "_tail", "byes", "dropping", "failed", "low")

    def __init__(self, headroom_min: float, host_available_min: int) -> None:
        self.low: set[int] = set()
        """Ranks whose newest host sample is low on memory (:func:`low_memory`)."""
        self.failed: set[int] = set()
        """Ranks whose Bye carries an error: a non-zero exit not stopped from outside."""
        self.byes: set[int] = set()
        """Ranks that said Bye."""
        self.dropping: set[int] = set()
        """Ranks whose agent counted dropped messages."""
        self._seen: dict[int, float] = {}
        """Rank -> last seen [s], for ranks without a Bye, in the order the times last moved."""
        self._tail = float("-inf")
        self._sorted = True
        self._memory = (headroom_min, host_available_min)

    def seen(self, rank: int, last_seen_s: float) -> None:
        """``rank``, without a Bye, was last seen at ``last_seen_s`` (it only moves forward).
        Called for most messages: the caller checks the Bye on the RankState it holds."""
        seen = self._seen
        seen.pop(rank, None)
        seen[rank] = last_seen_s
        if last_seen_s < self._tail:
            self._sorted = False
        else:
            self._tail = last_seen_s

    def host(self, rank: int, host: HostSample) -> None:
        """``rank``'s newest host sample is ``host`` (:func:`low_memory`, written out: this
        runs for every report that carries a sample)."""
        headroom_min, host_available_min = self._memory
        total, used = host.gpu_mem_total_bytes, host.gpu_mem_used_bytes
        available = host.mem_available_bytes
        if (total and used is not None and (total - used) / total < headroom_min) or (
            available is not None and available < host_available_min
        ):
            self.low.add(rank)
        else:
            self.low.discard(rank)

    def dropped(self, rank: int, dropped: int) -> None:
        """``rank``'s agent has dropped ``dropped`` messages in all."""
        if dropped:
            self.dropping.add(rank)
        else:
            self.dropping.discard(rank)

    def bye(self, rank: int, bye: Bye) -> None:
        """``rank`` said Bye (a later Bye replaces an earlier one, as on its RankState)."""
        self.byes.add(rank)
        self._seen.pop(rank, None)
        if bye.exit_code != 0 and not interrupted(bye.message):
            self.failed.add(rank)
        else:
            self.failed.discard(rank)

    def silent(self, now_s: float, silent_s: float) -> list[int]:
        """Ranks without a Bye not heard from for more than ``silent_s`` at ``now_s``, in rank
        order. Reads the silent ranks and one more while the times arrived in order."""
        if not self._sorted:
            self._seen = dict(sorted(self._seen.items(), key=_SEEN))
            self._tail = next(reversed(self._seen.values()), float("-inf"))
            self._sorted = True
        found = []
        for rank, seen in self._seen.items():
            # The alerts' own comparison, element by element: subtraction keeps the order, so
            # the first rank it fails for ends the silent ones.
            if not now_s - seen > silent_s:
                break
            found.append(rank)
        found.sort()
        return found

    def memory_rules(self, headroom_min: float, host_available_min: int) -> bool:
        """Whether ``low`` was judged by these thresholds (False: they changed since)."""
        return self._memory == (headroom_min, host_available_min)

    def rejudge_memory(
        self, hosts: dict[int, HostSample], headroom_min: float, host_available_min: int
    ) -> None:
        """Judge every rank's newest host sample again under changed thresholds."""
        self._memory = (headroom_min, host_available_min)
        self.low = {r for r, h in hosts.items() if low_memory(h, headroom_min, host_available_min)}
