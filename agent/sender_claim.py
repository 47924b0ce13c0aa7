"""Who a sender says it is, in its ZeroMQ handshake: part of the wire, beside the messages of
:mod:`zeroscope.agent.schema` (which re-exports it: the viewer side imports only the schema).
It stands alone like the schema: msgspec and nothing of the project."""

from __future__ import annotations

import msgspec


class SenderClaim(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Who a sender says it is, carried in its ZeroMQ handshake (the PLAIN user name; the
    password is the job token): the collector learns it even from a sender it refuses, so it
    can name the rank a wrong token belongs to. Text ``key=value`` pairs, at most 255 bytes."""

    role: str = "rank"
    rank: int = -1
    world_size: int = 0
    node_rank: int = -1
    hostname: str = ""

    def username(self) -> bytes:
        host = "".join(c for c in self.hostname if c.isprintable() and c not in " =")[:120]
        pairs = [
            ("role", "".join(c for c in self.role if c.isalnum())[:16] or "rank"),
            ("rank", str(self.rank)),
            ("world", str(self.world_size)),
            ("node", str(self.node_rank)),
            ("host", host),
        ]
        return " ".join(f"{k}={v}" for k, v in pairs).encode()[:255]

    @classmethod
    def parse(cls, text: bytes | str) -> SenderClaim:
        """The claim in a handshake user name; never raises (junk claims nothing)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        fields = dict(p.split("=", 1) for p in text.split() if "=" in p)

        def number(key: str, default: int) -> int:
            value = fields.get(key, "")
            digits = value[1:] if value.startswith("-") else value
            return int(value) if digits.isdigit() and len(digits) < 10 else default

        return cls(
            role=fields.get("role", "")[:16],
            rank=number("rank", -1),
            world_size=max(0, number("world", 0)),
            node_rank=number("node", -1),
            hostname=fields.get("host", "")[:120],
        )
