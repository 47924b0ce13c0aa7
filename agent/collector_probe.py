"""A node's own view of the collector its ranks report to: reached, refused, or unreachable.

Node K > 0 of a multi-node ``zeroscope run`` has no collector and no view: its ranks send to node
0. When they cannot (a wrong token, a wrong address, a firewall), node 0 names them as missing,
but whoever watches node K's console must hear it too, or it reads as working. So the launcher
opens one connection of its own, exactly as its ranks do (same address, same token, claiming to
be node K's launcher), and watches the handshake: the collector answers a wrong token with an
error at once (zeroscope/collector/gate.py), and an address that never completes a handshake is reported
after ``UNREACHABLE_S``. The probe sends no message and runs in the launcher, beside the job:
the training neither waits for it nor sees it, and any failure of the probe only silences it.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable

from .publish import Publisher
from .schema import SenderClaim

UNREACHABLE_S = 10.0
"""How long without a handshake before the console says the collector cannot be reached (the
ranks' agents wait at most 5 s at start-up, then go on without it)."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class CollectorProbe:
    """Says, once each, when the collector admits this node, refuses it, or stays silent."""

    def __init__(
        self,
        address: str,
        token: str,
        node_rank: int,
        *,
        say: Callable[[str], None] = _stderr,
        unreachable_s: float = UNREACHABLE_S,
    ) -> None:
        self.address = address
        self.say = say
        self.unreachable_s = unreachable_s
        self.state = "connecting"
        """connecting, reached, refused or unreachable."""
        self.detail = ""
        self._started = time.monotonic()
        claim = SenderClaim(role="launcher", node_rank=node_rank, hostname=socket.gethostname())
        self._publisher = Publisher(address, token.encode(), claim=claim)

    def poll(self, timeout: float = 0.0) -> None:
        """Watch the handshake for up to ``timeout`` s (the launcher's idle wait); never raises."""
        try:
            self._poll(timeout)
        except Exception:
            time.sleep(timeout)

    def _poll(self, timeout: float) -> None:
        pub = self._publisher
        pub.poll_connection(timeout)
        if pub.connected:
            if self.state != "reached":
                self.state, self.detail = "reached", ""
                self.say(f"zeroscope: the collector at {self.address} admitted this node")
        elif pub.refused:
            if self.state != "refused":
                self.state, self.detail = "refused", pub.refused
                self.say(
                    f"zeroscope: the collector at {self.address} refused this node: "
                    f"{pub.refused}; is ZEROSCOPE_TOKEN the same as node 0's? Node 0 lists "
                    "this node's ranks as missing; the training goes on."
                )
        elif self.state == "connecting" and time.monotonic() - self._started > self.unreachable_s:
            self.state, self.detail = "unreachable", self._silence()
            self.say(
                f"zeroscope: cannot reach the collector at {self.address} after "
                f"{self.unreachable_s:.0f} s ({self.detail}). Node 0 will list this node's "
                "ranks as missing; the training goes on."
            )

    def _silence(self) -> str:
        if self._publisher.reached:
            return "the port answers, but not with a zeroscope handshake"
        return "nothing answers: a wrong --master-addr or --port, or a firewall"

    def close(self) -> None:
        """At the job's end: repeat a failure (it may have scrolled away), then let go."""
        try:
            if self.state in ("refused", "unreachable", "connecting"):
                why = self.detail or self._silence()
                self.say(
                    f"zeroscope: this node's ranks did not reach the collector at {self.address} "
                    f"({why}); their telemetry is not in node 0's view or trace"
                )
            self._publisher.close(linger_ms=0)
        except Exception:
            pass
