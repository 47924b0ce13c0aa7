"""Tier 1: the wire schema round-trips every message, rejects bad input with a one-line reason,
and the nccl-tests bandwidth formulas match hand-computed values."""

from __future__ import annotations

import msgspec
import pytest

from zeroscope.agent import schema
from zeroscope.agent.schema import (
    Bye,
    Collective,
    ConfigSummary,
    Event,
    Heartbeat,
    Hello,
    HostSample,
    MemoryBytes,
    ParamCounts,
    Phases,
    StepReport,
    Transfer,
)
from zeroscope.state import bandwidth


def sample_messages() -> list[schema.Message]:
    return [
        Hello(
            schema_version=schema.SCHEMA_VERSION,
            job_id="j",
            rank=1,
            world_size=2,
            config=ConfigSummary(stage=2, precision="fp16", dp_world_size=2),
            params=ParamCounts(total=10, trainable=10),
        ),
        StepReport(
            rank=1,
            step=3,
            wall_ns=5,
            duration_s=0.5,
            phases=Phases(forward=0.1, backward=0.2),
            memory=MemoryBytes(params=1, grads=2, optim=3, activations=None),
            collectives=[Collective("all_reduce", 40, 2, 0.01, 0.02, 0.005)],
            transfers=[Transfer("d2h", 8, 0.0, 0.001)],
            loss=1.5,
            host=HostSample(cpu_percent=3.0),
            dropped=4,
        ),
        Event(rank=0, step=3, wall_ns=1, event="overflow", value=65536.0),
        Heartbeat(rank=0, step=3, wall_ns=1),
        Bye(rank=0, step=3, wall_ns=2, exit_code=1, message="boom"),
    ]


@pytest.mark.parametrize("message", sample_messages(), ids=lambda m: type(m).__name__)
def test_round_trip(message: schema.Message) -> None:
    assert schema.decode(schema.encode(message)) == message


def test_none_stays_none_not_zero() -> None:
    report = StepReport(rank=0, step=1, wall_ns=0, duration_s=0.1)
    back = schema.decode(schema.encode(report))
    assert isinstance(back, StepReport)
    assert back.memory.activations is None and back.loss is None and back.host is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "malformed"),
        (b"\xc1", "malformed"),
        (msgspec.msgpack.encode({"kind": "nope"}), "malformed"),
        (msgspec.msgpack.encode({"kind": "step", "rank": "x"}), "malformed"),
        (msgspec.msgpack.encode([1, 2, 3]), "malformed"),
        (b"\x00" * (schema.MAX_MESSAGE_BYTES + 1), "oversize"),
        (
            schema.encode(
                Hello(schema_version=schema.SCHEMA_VERSION + 1, job_id="", rank=0, world_size=1)
            ),
            "schema_version",
        ),
    ],
    ids=["empty", "reserved-byte", "unknown-kind", "bad-field", "array", "oversize", "version"],
)
def test_bad_input_is_one_line_schema_error(data: bytes, reason: str) -> None:
    with pytest.raises(schema.SchemaError) as info:
        schema.decode(data)
    assert info.value.reason == reason
    assert "\n" not in str(info.value) and str(info.value)


def test_deeply_nested_garbage_is_rejected_not_crashing() -> None:
    data = b"\x91" * 100_000 + b"\x00"  # 100k nested arrays
    with pytest.raises(schema.SchemaError):
        schema.decode(data)


def test_busbw_follows_nccl_tests() -> None:
    # 1 GB in 1 s among 8 ranks: all-reduce 2*7/8, all-gather/reduce-scatter 7/8, broadcast 1.
    assert bandwidth.busbw("all_reduce", 10**9, 1.0, 8) == pytest.approx(1.75e9)
    assert bandwidth.busbw("all_gather", 10**9, 1.0, 8) == pytest.approx(0.875e9)
    assert bandwidth.busbw("reduce_scatter", 10**9, 0.5, 8) == pytest.approx(1.75e9)
    assert bandwidth.busbw("broadcast", 10**9, 1.0, 8) == pytest.approx(1e9)
    assert bandwidth.busbw("all_reduce", 10, 0.0, 2) is None
    with pytest.raises(ValueError):
        bandwidth.bus_factor("all_reduce", 0)
