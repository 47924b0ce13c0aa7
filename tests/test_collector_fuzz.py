"""Tier 1: 10^5 random and mutated messages at the decoder and the collector: nothing crashes,
every message is counted (received == accepted + rejected), and what was accepted is what a
valid encoding says."""

from __future__ import annotations

import random
import time
from pathlib import Path

import msgspec
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from zeroscope.agent import schema
from zeroscope.agent.publish import set_credentials
from zeroscope.collector.server import Collector, wait_for
from zeroscope.store.trace import TraceReader

from .test_schema import sample_messages

VALID = [schema.encode(m) for m in sample_messages()]


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    choice = rng.randrange(7)
    if choice == 0 and b:  # flip bytes
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif choice == 1:  # truncate
        del b[rng.randrange(len(b) + 1) :]
    elif choice == 2:  # insert
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.randbytes(rng.randint(1, 8))
    elif choice == 3:  # pure noise
        return rng.randbytes(rng.randint(0, 64))
    elif choice == 4:  # splice two valid messages
        other = rng.choice(VALID)
        i, j = rng.randrange(len(b) + 1), rng.randrange(len(other) + 1)
        return bytes(b[:i]) + other[j:]
    elif choice == 5:  # re-encode with a field set to a random value
        obj = msgspec.msgpack.decode(data)
        key = rng.choice(list(obj)) if isinstance(obj, dict) else None
        if key is not None:
            obj[key] = rng.choice([None, -1, 2**64 - 1, 1.5, "x", [], {}, True, -(2**63)])
        return msgspec.msgpack.encode(obj)
    return bytes(b)  # choice 6: unchanged (valid)


def test_hundred_thousand_mutations_are_all_counted(tmp_path: Path) -> None:
    rng = random.Random(1234)
    col = Collector(record=tmp_path / "fuzz.zst")
    col.trace = None  # drive ingest() directly: same code path as the socket loop
    from zeroscope.store.trace import TraceWriter

    col.trace = TraceWriter(tmp_path / "fuzz.zst", commit_rows=50_000)
    accepted = []
    col.add_listener(accepted.append)
    n = 100_000
    sent = 0  # messages: each frame after the token is one; a lone frame is one (bad framing)
    t0 = time.perf_counter()
    for _ in range(n):
        frames = [b"", mutate(rng, rng.choice(VALID))]
        if rng.random() < 0.01:
            frames = frames[: rng.randrange(2)] + [b"x"] * rng.randrange(3)
        col.ingest(frames)
        sent += max(len(frames) - 1, 1)
    col.trace.close()
    elapsed = time.perf_counter() - t0
    assert col.received == sent
    assert col.received == col.accepted + sum(col.rejected.values())
    assert col.internal_errors == 0
    assert col.rejected["malformed"] > 1000 and col.accepted > 1000
    # Every accepted message re-encodes and decodes to itself (it is a real schema message).
    for m in accepted[:2000]:
        assert schema.decode(schema.encode(m)) == m
    with TraceReader(tmp_path / "fuzz.zst") as r:
        assert r.count() == col.seq
    print(f"{n} mutated messages in {elapsed:.2f} s")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=256))
def test_decoder_never_raises_anything_but_schema_error(data: bytes) -> None:
    try:
        schema.decode(data)
    except schema.SchemaError:
        pass


mp_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["hello", "step", "event", "heartbeat", "bye", "zzz"]),
    st.dictionaries(
        st.sampled_from(
            [
                "rank",
                "step",
                "wall_ns",
                "schema_version",
                "job_id",
                "world_size",
                "duration_s",
                "memory",
                "collectives",
                "event",
                "exit_code",
            ]
        ),
        mp_values,
    ),
)
def test_structured_garbage_is_rejected_or_valid(kind: str, fields: dict) -> None:
    data = msgspec.msgpack.encode({"kind": kind, **fields})
    try:
        m = schema.decode(data)
    except schema.SchemaError:
        return
    assert schema.decode(schema.encode(m)) == m


def test_garbage_over_the_socket_is_counted() -> None:
    rng = random.Random(7)
    with Collector() as col:
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        set_credentials(push)
        push.connect(col.ingest_address)
        n = 5000
        for _ in range(n):
            push.send_multipart([b"", mutate(rng, rng.choice(VALID))])
        assert wait_for(lambda: col.received == n, 20)
        push.close(0)
        ctx.term()
    assert col.received == col.accepted + sum(col.rejected.values())
    assert col.internal_errors == 0
