"""The collector's view of the node relays (collector/relay.py) that forward to it.

A relay beats every half second on its one connection (a node batch counts as a beat: a relay
that sent one within the half second does not beat). When a relay falls silent for
``RELAY_SILENT_S`` its node's ranks go quiet all at once, and "no word from r1024-1031" would
leave the reader to guess why; so the collector says it, as one of its own
:class:`~zeroscope.agent.schema.Admission` records: reason ``relay_down``, role ``relay``, the
relay's claimed node and host, the address it came from, and in ``detail`` the sentence
"relay on node N unreachable". When the relay beats again, a ``relay_up`` record with the same
claim says the node is back. Records are written only on those transitions, so a healthy job's
trace holds none, and the views pick the newest of the two per node (state/relays.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from zeroscope.agent.schema import Admission, SenderClaim

RELAY_SILENT_S = 3.0
"""A relay silent this long is unreachable (six missed beats: a loaded node still makes it)."""

MAX_RELAYS = 8192
"""Relays tracked at most (one per node): a stranger with the token cannot grow it without bound."""


@dataclass(slots=True)
class _Relay:
    claim: SenderClaim
    peer: str
    last_s: float
    down: bool = False
    outages: int = 0


class RelayBook:
    """Beats per relay and the transitions to say (see module doc)."""

    def __init__(self) -> None:
        self._relays: dict[tuple[int, str], _Relay] = {}
        self.beats = 0

    def __len__(self) -> int:
        return len(self._relays)

    def beat(self, claim: SenderClaim, peer: str, now_s: float | None = None) -> Admission | None:
        """One beat of the relay ``claim``; the ``relay_up`` record when it was down."""
        now = time.monotonic() if now_s is None else now_s
        self.beats += 1
        key = (claim.node_rank, claim.hostname)
        relay = self._relays.get(key)
        if relay is None:
            if len(self._relays) >= MAX_RELAYS:
                return None
            self._relays[key] = _Relay(claim, peer, now)
            return None
        relay.last_s, relay.peer = now, peer or relay.peer
        if not relay.down:
            return None
        relay.down = False
        return _record(relay, "relay_up", f"relay on node {claim.node_rank} reachable again")

    def due(self, now_s: float | None = None) -> list[Admission]:
        """``relay_down`` records of relays that just went silent past RELAY_SILENT_S."""
        now = time.monotonic() if now_s is None else now_s
        out = []
        for relay in self._relays.values():
            if relay.down or now - relay.last_s <= RELAY_SILENT_S:
                continue
            relay.down = True
            relay.outages += 1
            node = relay.claim.node_rank
            out.append(
                _record(
                    relay,
                    "relay_down",
                    f"relay on node {node} unreachable (nothing for {now - relay.last_s:.0f}s)",
                )
            )
        return out


def _record(relay: _Relay, reason: str, detail: str) -> Admission:
    c = relay.claim
    return Admission(
        wall_ns=time.time_ns(),
        reason=reason,
        count=relay.outages,
        unit="outage",
        peer=relay.peer,
        node_rank=c.node_rank,
        hostname=c.hostname,
        role="relay",
        detail=detail,
    )
