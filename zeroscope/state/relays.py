"""Nodes whose relay the collector can no longer hear (zeroscope/collector/relays.py).

A node's ranks report through its relay; when the relay dies, every one of them goes quiet at
the same instant, and the silent-rank alert alone would leave the reader to guess why. The
collector says it with its own records (``relay_down`` / ``relay_up``, role ``relay``, the
node's index); the newest of the two per node tells whether the relay is out now, and the
node's ranks are those whose Hello names that node.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from zeroscope.agent.schema import Admission, Hello

from .roster import MissingGroup

if TYPE_CHECKING:
    from .cluster import ClusterState

RELAY_REASONS = ("relay_down", "relay_up")


def relay_outages(records: Iterable[Admission], hellos: Iterable[Hello]) -> list[MissingGroup]:
    """One group per node whose relay is out now: its ranks, and the collector's sentence."""
    newest: dict[tuple[int, str], Admission] = {}
    for rec in records:
        if rec.role != "relay" or rec.reason not in RELAY_REASONS:
            continue
        key = (rec.node_rank, rec.hostname)
        seen = newest.get(key)
        if seen is None or rec.wall_ns >= seen.wall_ns:
            newest[key] = rec
    down = [rec for rec in newest.values() if rec.reason == "relay_down"]
    if not down:
        return []
    by_node: dict[int, list[int]] = {}
    for h in hellos:
        by_node.setdefault(h.node_rank, []).append(h.rank)
    out = []
    for rec in sorted(down, key=lambda r: r.node_rank):
        where = f" ({rec.hostname}{', ' + rec.peer if rec.peer else ''})" if rec.hostname else ""
        ranks = tuple(sorted(by_node.get(rec.node_rank, [])))
        out.append(MissingGroup(ranks, rec.node_rank, "relay_down", rec.detail + where))
    return out


def relay_outages_of(state: ClusterState) -> list[MissingGroup]:
    """:func:`relay_outages` of a live or replayed ClusterState. The Hellos are read only when
    some relay is out (the alerts ask every frame; a list of 16,384 Hellos each time cost more
    than the rest of the check)."""
    hellos = (rs.hello for rs in state.ranks.values() if rs.hello is not None)
    return relay_outages(state.roster.records.values(), hellos)
