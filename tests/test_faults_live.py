"""Tier 1-2 faults around the live view: a viewer that stops reading, and a rank whose clock is
far off.

- A viewer that stops reading never slows the collector: its updates pile up to the PUB's
  high-water mark and are then dropped for that viewer alone; when it reads again it repairs
  the gap from the collector's history (the Clone pattern's snapshot) and ends with every
  message, in order, exactly once.
- Views align ranks by step, never by wall clock: a rank whose clock is an hour off (either
  way) still lands in the right steps, is neither "silent" nor a straggler, and the replay of
  the trace says the same as the live view.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from tests.fixtures import write_trace
from zeroscope.agent import schema
from zeroscope.agent.publish import set_credentials
from zeroscope.agent.schema import SCHEMA_VERSION, Collective, Hello, Message, StepReport
from zeroscope.collector import server as collector_module
from zeroscope.collector.server import Collector, wait_for
from zeroscope.state import ClusterState
from zeroscope.state.lines import step_line, summary_lines
from zeroscope.store.sources import LiveSource, TraceSource


def report(rank: int, step: int, wall_ns: int = 0, duration_s: float = 0.1) -> StepReport:
    return StepReport(
        rank=rank,
        step=step,
        wall_ns=wall_ns,
        duration_s=duration_s,
        loss=1.0 / step,
        collectives=[
            Collective(
                op="reduce_scatter",
                nbytes=1 << 20,
                group_size=2,
                start_s=0.01 * i,
                duration_s=0.005,
                exposed_s=0.001,
                label=f"bucket-{i:04d}-of-a-realistic-label",
            )
            for i in range(16)
        ],
    )


def test_a_viewer_that_stops_reading_never_blocks_and_catches_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(collector_module, "VIEWER_HWM", 500)
    n = 20_000  # ~1 KB each: 20 MB, far past the PUB queue and the kernel's socket buffers
    payloads = [schema.encode(report(i % 2, i // 2 + 1)) for i in range(n)]
    with Collector() as col:
        viewer = LiveSource(col.viewer_address)
        viewer._sub.setsockopt(zmq.RCVHWM, 100)  # a small queue on the viewer's side too
        updates = 0  # live updates that reached the viewer (the rest were dropped for it)
        on_update = viewer._on_update

        def counting_update(frames: list[bytes], out: list[Message]) -> None:
            nonlocal updates
            updates += 1
            on_update(frames, out)

        viewer._on_update = counting_update  # type: ignore[method-assign]
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        set_credentials(push)
        push.connect(col.ingest_address)
        try:
            hello = Hello(schema_version=SCHEMA_VERSION, job_id="j", rank=0, world_size=2)
            push.send_multipart([b"", schema.encode(hello)])
            first: list[Message] = []
            assert wait_for(lambda: bool(first.extend(viewer.poll(0.05)) or first), 10)
            # The viewer now sleeps; the job goes on.
            for p in payloads:
                push.send_multipart([b"", p])
            assert wait_for(lambda: col.received == n + 1, 60)  # the collector kept up alone
            got: list[Message] = list(first)
            assert wait_for(lambda: bool(got.extend(viewer.poll(0.2))) or len(got) >= n + 1, 60)
        finally:
            push.close(0)
            ctx.term()
            viewer.close()
    assert col.accepted == n + 1 and col.internal_errors == 0
    assert len(got) == n + 1
    assert [schema.encode(m) for m in got[1:]] == payloads  # all, in order, once
    # Most updates were dropped for the sleeping viewer; the history filled the gap.
    assert updates < n // 2
    print(
        f"viewer asleep for {n} messages: {updates} live updates reached it, the rest came "
        "from the snapshot history"
    )


HOUR_NS = 3600 * 10**9


def skewed_run(offset_ns: int, steps: int = 20, ranks: int = 4) -> list[Message]:
    """``ranks`` ranks in lock-step, 0.1 s per step, rank 1's clock ``offset_ns`` off; rank 3
    is truly slower (0.2 s), so a straggler exists to be found."""
    base = time.time_ns() - steps * 10**8 - 10**9
    out: list[Message] = [
        Hello(
            schema_version=SCHEMA_VERSION, job_id="skew", rank=r, world_size=ranks, started_ns=base
        )
        for r in range(ranks)
    ]
    for s in range(1, steps + 1):
        for r in range(ranks):
            wall = base + s * 10**8 + (offset_ns if r == 1 else 0)
            out.append(report(r, s, wall, 0.2 if r == 3 else 0.1))
    return out


@pytest.mark.parametrize("offset_ns", [HOUR_NS, -HOUR_NS])
def test_a_rank_with_a_far_off_clock_is_aligned_by_step(offset_ns: int, tmp_path: Path) -> None:
    messages = skewed_run(offset_ns)
    # Live: arrival time is the receiver's clock, as zeroscope run passes it.
    live = ClusterState()
    lines = []
    for m in messages:
        lines += [step_line(a) for a in live.ingest(m, time.time())]
    assert [int(x.split()[1]) for x in lines] == list(range(1, 21))
    for agg in live.complete_steps():
        assert set(agg.summaries) == {0, 1, 2, 3}
        assert agg.step_time == pytest.approx(0.2) and agg.slowest_rank == 3
    alerts = {a.kind: a for a in live.alerts(time.time())}
    assert "silent" not in alerts
    assert alerts["straggler"].ranks == (3,)  # the real one, not the skewed clock
    # Replay: no receiver clock; the trace must say the same.
    write_trace(tmp_path / "skew.zstrace", messages)
    source = TraceSource(tmp_path / "skew.zstrace")
    replay = ClusterState()
    again = []
    for m in source.reader.hellos():
        replay.ingest(m)
    for m in source.reader.messages():
        again += [step_line(a) for a in replay.ingest(m)]
    source.close()
    assert again == lines
    replayed = {a.kind for a in replay.alerts()}
    assert "silent" not in replayed and "straggler" in replayed
    assert summary_lines(replay)[1:] == summary_lines(live)[1:]


def test_a_rank_that_dies_without_a_word_is_named_with_its_last_step() -> None:
    from zeroscope.agent.schema import Bye
    from zeroscope.tui.rank_rows import flags_from_alerts

    state = ClusterState()
    for m in skewed_run(0, steps=5, ranks=2):
        if not (m.rank == 1 and isinstance(m, StepReport) and m.step > 3):  # r1 dies in step 4
            state.ingest(m)
    state.ingest(Bye(rank=0, step=5, wall_ns=time.time_ns(), exit_code=1, message="reset"))
    state.flush()
    (lost,) = [a for a in state.alerts() if a.kind == "lost"]
    assert lost.ranks == (1,) and lost.message == "r1 died without a word after step 3 (no Bye)"
    assert flags_from_alerts(state, state.alerts()) == {0: "exited", 1: "died"}
    lines = summary_lines(state)
    assert "rank r1 died without a word after step 3 (killed or crashed: no Bye)" in lines
    assert "rank 0 exited with code 1: reset" in lines
    # Every rank ended cleanly: nobody is lost.
    state.ingest(Bye(rank=1, step=5, wall_ns=time.time_ns()))
    assert "lost" not in {a.kind for a in state.alerts()}
