"""The node table's view-model: one row per node (the cluster screen of a job too large to read
a rank at a time), the slowest rank's slowness and the node's exposed share judged, and the
ranks of one node for the drill-down.

The figures are zeroscope.state.nodes' (folded per node, only the nodes whose ranks changed);
this adds the names and the judgements, and the alert flags the caller found per rank. A
:class:`NodeView` makes a row only when asked for it: a screen shows ~40 of a 16,384-rank job's
2,048 nodes, and after every step each node's figures change, so a frame that made every row
folded every rank; it now folds the nodes on screen (sorting by a figure still asks for all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zeroscope.state.alerts import Level
from zeroscope.state.nodes import UNPLACED, NodeKey

if TYPE_CHECKING:
    from collections.abc import Iterable

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


class NodeView:
    """The node table of one state: every node's key, name and flags at once, its figures only
    when its row is asked for (each row made once per view)."""

    def __init__(self, state: ClusterState, flagged: dict[int, str] | None = None) -> None:
        self._state = state
        self.keys: list[NodeKey] = state.nodes.keys()
        """Every node, by node rank then hostname."""
        self._shared = state.nodes.shared_hosts()
        flags: dict[NodeKey, list[tuple[int, str]]] = {}
        for rank, word in sorted((flagged or {}).items()):
            key = state.nodes.node_of(rank)
            if key is not None:
                flags.setdefault(key, []).append((rank, word))
        self.flags: dict[NodeKey, tuple[tuple[int, str], ...]] = {
            key: tuple(found) for key, found in flags.items()
        }
        """(rank, flag word) of each node's flagged ranks, by rank; nodes with none absent."""
        self._rows: dict[NodeKey, NodeRow] = {}

    def name(self, key: NodeKey) -> str:
        return node_name(key, key[1] in self._shared)

    def rows(self, keys: Iterable[NodeKey]) -> list[NodeRow]:
        """The rows of ``keys``, in their order (a node nobody runs on any more is left out)."""
        keys = list(keys)
        wanted = [key for key in keys if key not in self._rows]
        if wanted:
            rules = self._state.rules
            for f in self._state.nodes.figures(self._state.ranks, wanted):
                self._rows[f.key] = NodeRow(
                    key=f.key,
                    name=self.name(f.key),
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
                    flags=self.flags.get(f.key, ()),
                )
        return [self._rows[key] for key in keys if key in self._rows]

    def all_rows(self) -> list[NodeRow]:
        """Every node's row, by node rank then hostname."""
        return self.rows(self.keys)


def node_rows(state: ClusterState, flagged: dict[int, str] | None = None) -> list[NodeRow]:
    """Every node's row, by node rank then hostname."""
    return NodeView(state, flagged).all_rows()


def node_ranks(state: ClusterState, key: NodeKey) -> list[int]:
    """The node's ranks, ascending (the drill-down's table)."""
    return state.nodes.members(key)
