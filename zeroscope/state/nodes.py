"""The job's nodes: which ranks run on which machine, and each node's figures for the cluster
screen's node table (a job of thousands of ranks is read a node at a time).

A rank's node is what its Hello names: the host and the launcher's node rank (both, since
network namespaces acting as nodes on one machine share a hostname). A node's figures are
folded from its ranks' newest step summaries; a report marks only its own node stale, and a
stale node is folded again when a view asks (a few ranks each), so a step of 16,384 reports
costs one set insertion per report and no whole-cluster pass until the node table is drawn.
A closed step re-judges every rank's slowness, so it marks every node stale once per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from zeroscope.agent.schema import Hello

    from .rank import RankState

NodeKey = tuple[int, str]
"""(node rank, hostname) as the rank's Hello said them."""

UNPLACED: NodeKey = (-1, "")
"""Ranks heard from before their Hello (the node is not known yet)."""


@dataclass(slots=True)
class NodeFigures:
    """One node's newest figures, folded from its ranks. None = no rank reported it (NA)."""

    key: NodeKey
    ranks: tuple[int, ...]
    """Its ranks, ascending."""
    reporting: int
    """Ranks that have reported a step."""
    step: int | None
    """The oldest of its ranks' newest steps: a rank that stopped reporting holds it back."""
    step_time: float | None
    """Its slowest rank's newest step time [s]."""
    slowest_rank: int | None
    """The rank with the highest slowness (compute vs the median of the job's other ranks);
    before any step was judged, the one with the longest step."""
    slowness: float | None
    """That rank's slowness [ratio]; NA until judged."""
    memory_max: int | None
    """The most device memory (P + G + O + A) any of its ranks holds [bytes]."""
    memory_min: int | None
    exposed: float | None
    """The least-exposed rank's exposed share [fraction], the node's own communication cost
    (the others' extra wait is waiting for slower peers, as for the whole cluster's figure)."""


def fold(key: NodeKey, ranks: list[RankState]) -> NodeFigures:
    """A node's figures from its ranks' states (the one definition; tests recompute it over
    every rank by brute force)."""
    steps, memories, exposed = [], [], []
    step_time: float | None = None
    slowest: tuple[float, float, int] | None = None
    for rs in ranks:
        s = rs.summary
        if s is None:
            continue
        steps.append(s.step)
        took = s.duration_s
        if step_time is None or took > step_time:
            step_time = took
        memory = s.device_total
        if memory is not None:
            memories.append(memory)
        share = s.exposed_share
        if share is not None:
            exposed.append(share)
        # Judged ranks outrank unjudged ones; then the higher slowness, then the longer step,
        # then the lower rank.
        slowness = rs.slowness
        candidate = (0.0, took, -rs.rank) if slowness is None else (1.0, slowness, -rs.rank)
        if slowest is None or candidate > slowest:
            slowest = candidate
    slowest_rank = None if slowest is None else -slowest[2]
    slowness = None
    if slowest is not None and slowest[0]:
        slowness = slowest[1]
    return NodeFigures(
        key=key,
        ranks=tuple(sorted(rs.rank for rs in ranks)),
        reporting=len(steps),
        step=min(steps) if steps else None,
        step_time=step_time,
        slowest_rank=slowest_rank,
        slowness=slowness,
        memory_max=max(memories) if memories else None,
        memory_min=min(memories) if memories else None,
        exposed=min(exposed) if exposed else None,
    )


class NodeBook:
    """Ranks by node, and each node's figures refolded only when one of its ranks changed."""

    def __init__(self) -> None:
        self._node_of: dict[int, NodeKey] = {}
        self._members: dict[NodeKey, dict[int, None]] = {}
        """Each node's ranks in arrival order (a dict: insertion-ordered, O(1) removal)."""
        self._stale: set[NodeKey] = set()
        self._figures: dict[NodeKey, NodeFigures] = {}
        self._sorted: tuple[list[NodeKey], frozenset[str]] | None = None
        """(every node sorted, hostnames several nodes share), kept until a node comes or goes:
        the node table asks every frame, and 2,048 nodes cost ~0.5 ms to sort and count."""

    def place(self, rank: int, hello: Hello) -> None:
        """A rank said hello: it belongs to the node its Hello names (moved if it said another
        before, or reported before saying any)."""
        self._move(rank, (hello.node_rank, hello.hostname))

    def touch(self, rank: int) -> None:
        """The rank's figures changed: its node is folded again when next asked."""
        key = self._node_of.get(rank)
        if key is None:
            key = self._move(rank, UNPLACED)
        self._stale.add(key)

    def touch_all(self) -> None:
        """Every rank's slowness changed (a step closed)."""
        self._stale.update(self._members)

    def _move(self, rank: int, key: NodeKey) -> NodeKey:
        old = self._node_of.get(rank)
        if old == key:
            return key
        if old is not None:
            members = self._members[old]
            members.pop(rank, None)
            self._stale.add(old)
            if not members:
                del self._members[old]
                self._sorted = None
                self._figures.pop(old, None)
                self._stale.discard(old)
        self._node_of[rank] = key
        if key not in self._members:
            self._members[key] = {}
            self._sorted = None
        self._members[key][rank] = None
        self._stale.add(key)
        return key

    @property
    def count(self) -> int:
        """How many nodes the ranks heard from run on."""
        return len(self._members)

    @property
    def several(self) -> bool:
        """The ranks run on more than one node (a node table has something to group)."""
        return len(self._members) > 1

    def node_of(self, rank: int) -> NodeKey | None:
        return self._node_of.get(rank)

    def members(self, key: NodeKey) -> list[int]:
        """The node's ranks, ascending (empty for a node nobody runs on)."""
        return sorted(self._members.get(key, ()))

    def keys(self) -> list[NodeKey]:
        """Every node the ranks run on, by node rank then hostname."""
        return list(self._layout()[0])

    def shared_hosts(self) -> frozenset[str]:
        """Hostnames more than one node names (network namespaces acting as nodes)."""
        return self._layout()[1]

    def _layout(self) -> tuple[list[NodeKey], frozenset[str]]:
        if self._sorted is None:
            keys = sorted(self._members)
            hosts: dict[str, int] = {}
            for _, host in keys:
                hosts[host] = hosts.get(host, 0) + 1
            self._sorted = (keys, frozenset(h for h, n in hosts.items() if n > 1))
        return self._sorted

    def figures(
        self, ranks: dict[int, RankState], keys: Iterable[NodeKey] | None = None
    ) -> list[NodeFigures]:
        """Every node's figures by node rank then hostname, or those of ``keys`` in their order
        (a screen's worth: the others stay stale, unfolded); only stale nodes are refolded."""
        if keys is None:
            for key in self._stale:
                members = self._members.get(key)
                if members:
                    self._figures[key] = fold(key, [ranks[r] for r in members if r in ranks])
            self._stale.clear()
            return [self._figures[key] for key in sorted(self._figures)]
        out = []
        for key in keys:
            members = self._members.get(key)
            if not members:
                continue
            if key in self._stale or key not in self._figures:
                self._figures[key] = fold(key, [ranks[r] for r in members if r in ranks])
                self._stale.discard(key)
            out.append(self._figures[key])
        return out
