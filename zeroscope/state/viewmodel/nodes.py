"""The node table's view-model: one row per node (the cluster screen of a job too large to read
a rank at a time), the slowest rank's slowness and the node's exposed share judged, and the
ranks of one node for the drill-down.

The figures are zeroscope.state.nodes' (folded per node, only the nodes whose ranks changed);
this adds the names and the judgements, and the alert flags the caller found per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zeroscope.state.alerts import Level
from zeroscope.state.nodes import UNPLACED, NodeKey

if TYPE_CHECKING:
    from zeroscope.state.cluster import ClusterState


@dataclass(frozen=True, slots=True)
class NodeRow:
    key: NodeKey
    """(node rank, hostname): what the drill-down asks for."""
    name: str
    """The hostname; with ``#node rank`` when several nodes share one (network namespaces)."""
    ranks: int
    reporting: int
    step: int | None
    step_time: float | None
    slowest_rank: int | None
    slowness: float | None
    slowness_level: Level
    memory_max: int | None
    memory_min: int | None
    exposed: float | None
    exposed_level: Level
    flags: tuple[tuple[int, str], ...]
    """(rank, flag word) of its ranks that some alert flags, by rank."""


def node_name(key: NodeKey, shared: bool = False) -> str:
    node_rank, host = key
    if key == UNPLACED:
        return "(no hello)"
    if not host:
        return f"node {node_rank}"
    return f"{host}#{node_rank}" if shared else host


def node_rows(state: ClusterState, flagged: dict[int, str] | None = None) -> list[NodeRow]:
    """Every node's row, by node rank then hostname."""
    figures = state.nodes.figures(state.ranks)
    hosts: dict[str, int] = {}
    for f in figures:
        hosts[f.key[1]] = hosts.get(f.key[1], 0) + 1
    flags: dict[NodeKey, list[tuple[int, str]]] = {}
    for rank, word in sorted((flagged or {}).items()):
        key = state.nodes.node_of(rank)
        if key is not None:
            flags.setdefault(key, []).append((rank, word))
    rules = state.rules
    return [
        NodeRow(
            key=f.key,
            name=node_name(f.key, hosts[f.key[1]] > 1),
            ranks=len(f.ranks),
            reporting=f.reporting,
            step=f.step,
            step_time=f.step_time,
            slowest_rank=f.slowest_rank,
            slowness=f.slowness,
            slowness_level=rules.slowness_level(f.slowness),
            memory_max=f.memory_max,
            memory_min=f.memory_min,
            exposed=f.exposed,
            exposed_level=rules.exposed_level(f.exposed),
            flags=tuple(flags.get(f.key, ())),
        )
        for f in figures
    ]


def node_ranks(state: ClusterState, key: NodeKey) -> list[int]:
    """The node's ranks, ascending (the drill-down's table)."""
    return state.nodes.members(key)
