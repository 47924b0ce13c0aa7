"""Which ranks of the job have reported, which never did, and the likeliest reason why.

A cluster view that quietly shows half the cluster is worse than none, so every rank the job has
and the view lacks is named. The world size is the largest any Hello announced (or, when no rank
got through at all, what refused senders claimed). A rank has reported once any message of it was
accepted. For each rank that has not, the collector's ``Admission`` records (zeroscope/collector/gate.py)
say what its door saw, most telling first:

1. records that claim the rank itself: its handshake refused for a wrong token (with the address
   it came from), its messages rejected (another version, oversize, malformed), or a connection
   admitted that never sent anything valid;
2. a record of its node's launcher (``zeroscope run`` on that node): refused, or admitted while
   the node's ranks sent nothing (a script that does not report through zeroscope);
3. senders turned away that named no rank (ZeroMQ handshakes of a non-zeroscope sender);
4. otherwise nothing was heard at all: the node was not launched under zeroscope, it cannot
   reach the collector, or the rank ended before its first report.

Ranks are grouped by node (torchrun places a node's ranks contiguously: node = rank // ranks per
node, learned from the Hellos) and by reason, so 1024 missing ranks read as a few lines.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zeroscope.agent.schema import Admission, Hello

if TYPE_CHECKING:
    from .cluster import ClusterState

UNHEARD = "unheard"
"""The reason code of a rank the collector heard nothing of, or about."""

_ORDER = ("unauthenticated", "schema_version", "handshake", "oversize", "malformed", "framing")
"""Refusal reasons, most telling first; ``admitted`` (connected, nothing valid) comes last."""


@dataclass(frozen=True, slots=True)
class MissingGroup:
    """Ranks that never reported, on one node, for one reason."""

    ranks: tuple[int, ...]
    node: int | None
    reason: str
    """An Admission reason (``unauthenticated``, ``malformed``...) or ``unheard``."""
    explanation: str

    @property
    def label(self) -> str:
        where = f" (node {self.node})" if self.node is not None else ""
        return rank_ranges(self.ranks) + where

    @property
    def text(self) -> str:
        return f"{self.label}: {self.explanation}"


class Roster:
    """The collector's Admission records (newest per sender) and when the roster call began."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str, int, int, str], Admission] = {}
        self.since_s: float | None = None
        """When the first Hello (or record) arrived: the grace period counts from here."""

    def note(self, record: Admission, at_s: float) -> None:
        key = (record.reason, record.peer, record.rank, record.node_rank, record.role)
        self.records[key] = record  # running totals: the newest holds them
        self.start(at_s)

    def start(self, at_s: float) -> None:
        self.since_s = at_s if self.since_s is None else min(self.since_s, at_s)


def rank_ranges(ranks: Iterable[int], limit: int = 6) -> str:
    """``r1,r3-5,r8-15``: consecutive ranks as ranges, at most ``limit`` pieces then ``+N``."""
    pieces: list[list[int]] = []
    for r in sorted(set(ranks)):
        if pieces and r == pieces[-1][1] + 1:
            pieces[-1][1] = r
        else:
            pieces.append([r, r])
    shown = [f"r{a}" if a == b else f"r{a}-{b}" for a, b in pieces[:limit]]
    rest = sum(b - a + 1 for a, b in pieces[limit:])
    return ",".join(shown) + (f" +{rest}" if rest else "")


def node_of(hellos: Iterable[Hello]) -> Callable[[int], int | None]:
    """rank -> node, when the Hellos show torchrun's contiguous layout (node = rank // L, with L
    ranks per node from ``local_world_size``, or from a rank on a node other than 0)."""
    hellos = list(hellos)
    sizes = {h.local_world_size for h in hellos if h.local_world_size > 0}
    if not sizes:
        sizes = {
            (h.rank - h.local_rank) // h.node_rank
            for h in hellos
            if h.node_rank > 0 and (h.rank - h.local_rank) % h.node_rank == 0
        }
    if len(sizes) == 1:
        per_node = sizes.pop()
        if per_node > 0 and all(h.rank // per_node == h.node_rank for h in hellos):
            return lambda rank: rank // per_node
    return lambda rank: None


def expected_world(world_size: int, records: Iterable[Admission]) -> int:
    """The job's rank count: the Hellos' world size, else the largest a refused rank claimed."""
    claimed = (r.world_size for r in records if r.role != "launcher" and r.reason != "admitted")
    return world_size or max(claimed, default=0)


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}{'s' if n != 1 else ''}"


def _peers(records: list[Admission]) -> str:
    peers = sorted({r.peer for r in records if r.peer})
    return " from " + ", ".join(peers[:3]) + (" ..." if len(peers) > 3 else "") if peers else ""


def _explain(reason: str, records: list[Admission], node: int | None) -> str:
    """One line saying what the door saw, with counts and addresses."""
    n = sum(r.count for r in records)
    counted = _count(n, records[0].unit if records else "message") + _peers(records)
    detail = next((r.detail for r in records if r.detail), "")
    launcher = any(r.role == "launcher" for r in records)
    node_zs = f"node {node}'s zeroscope" if node is not None else "its node's zeroscope"
    if reason == "unauthenticated":
        subject = f"{node_zs} was" if launcher else "its reports were"
        return f"{subject} refused: wrong ZEROSCOPE_TOKEN ({counted})"
    if reason == "admitted" and launcher:
        return (
            f"{node_zs} reached the collector{_peers(records)}, but its ranks sent nothing "
            "(does the script report through zeroscope?)"
        )
    if reason == "admitted":
        return f"connected but sent nothing valid ({counted})"
    if reason == "handshake":
        return (
            f"nothing accepted; {counted} failed the handshake (a sender without this "
            "zeroscope's credentials: another version?)"
        )
    what = {"schema_version": "another zeroscope version", "oversize": "over the size limit"}
    return f"its messages were rejected: {what.get(reason, reason)} ({counted}; {detail})"


def _rank_cause(
    mine: list[Admission], node_records: list[Admission], anonymous: list[Admission]
) -> tuple[str, list[Admission]]:
    """The most telling (reason, records) for one missing rank."""
    for pool in (mine, node_records, anonymous):
        if not pool:
            continue
        reasons = {r.reason for r in pool}
        best = next((x for x in _ORDER if x in reasons), None) or sorted(reasons)[0]
        return best, [r for r in pool if r.reason == best]
    return UNHEARD, []


def missing_groups(
    world_size: int,
    reported: Collection[int],
    hellos: Iterable[Hello],
    records: Iterable[Admission],
) -> list[MissingGroup]:
    """Every rank in ``range(world)`` not in ``reported``, grouped by (node, reason, peers)."""
    records = list(records)
    world = expected_world(world_size, records)
    missing = [r for r in range(world) if r not in reported]
    if not missing:
        return []
    layout = node_of(hellos)
    by_rank: dict[int, list[Admission]] = {}
    by_node: dict[int, list[Admission]] = {}
    anonymous: list[Admission] = []
    for rec in records:
        if rec.role == "launcher" and rec.node_rank >= 0:
            by_node.setdefault(rec.node_rank, []).append(rec)
        elif rec.rank >= 0:
            by_rank.setdefault(rec.rank, []).append(rec)
        elif rec.reason != "admitted" and rec.role != "relay":
            anonymous.append(rec)  # (a relay's own outage names its node's ranks elsewhere)
    groups: dict[tuple[int | None, str, tuple[str, ...]], tuple[list[int], list[Admission]]] = {}
    for rank in missing:
        mine = by_rank.get(rank, [])
        node = next((r.node_rank for r in mine if r.node_rank >= 0), None)
        node = layout(rank) if node is None else node
        node_records = by_node.get(node, []) if node is not None else []
        reason, chosen = _rank_cause(mine, node_records, anonymous)
        key = (node, reason, tuple(sorted({r.peer for r in chosen})))
        ranks, recs = groups.setdefault(key, ([], []))
        ranks.append(rank)
        recs.extend(r for r in chosen if r not in recs)
    out = []
    for (node, reason, _), (ranks, recs) in groups.items():
        text = (
            "nothing heard from it: not launched under zeroscope, cannot reach the collector, "
            "or ended before its first report"
            if reason == UNHEARD
            else _explain(reason, recs, node)
        )
        out.append(MissingGroup(tuple(ranks), node, reason, text))
    return sorted(out, key=lambda g: g.ranks[0])


def missing_of(state: ClusterState) -> list[MissingGroup]:
    """:func:`missing_groups` of a live or replayed ClusterState (the Hellos are read only when
    some rank is missing: the alerts ask every frame)."""
    hellos = (rs.hello for rs in state.ranks.values() if rs.hello is not None)
    return missing_groups(state.world_size, state.ranks, hellos, state.roster.records.values())


def headcount(state: ClusterState) -> tuple[int, int]:
    """(ranks reported, ranks the job has) for the header's ``ranks 8/16``."""
    world = expected_world(state.world_size, state.roster.records.values())
    return len(state.ranks), max(world, len(state.ranks))


def missing_summary(groups: list[MissingGroup], reported: int, world: int, limit: int = 3) -> str:
    """One line for the alert strip: how many are missing, then the first groups."""
    shown = "; ".join(g.text for g in groups[:limit])
    more = f"; +{len(groups) - limit} more groups" if len(groups) > limit else ""
    return f"{world - reported} of {world} ranks never reported: {shown}{more}"
