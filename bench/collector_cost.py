"""Where the collector's CPU goes per report: direct (each report decoded) against a node
relay's batch (taken by its header), in one process, no sockets but the viewers' PUB.

The same synthetic reports (bench/relay_ingest.py's: 8 collectives, 9 records each) go through
``Collector.ingest`` one by one, and through the node batch path (``NodeBatcher`` on the relay's
side, then the collector's header decode, slicing and ``_take``), with and without the trace
(written inline here; in the collector it is the trace thread's, in the same process).
CPU is ``time.process_time()`` per report.

Usage: ``python bench/collector_cost.py [--reports 16384] [--per-node 64]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import zmq

    from bench.relay_ingest import _reports
    from zeroscope.agent import schema
    from zeroscope.agent.schema import Hello
    from zeroscope.collector.relay_batch import NodeBatcher
    from zeroscope.collector.server import Collector
    from zeroscope.store.thinning import ThinningPolicy
    from zeroscope.store.trace import TraceWriter

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reports", type=int, default=16384)
    p.add_argument("--per-node", type=int, default=64)
    args = p.parse_args()
    n, per = args.reports, args.per_node
    reports = _reports(range(n), 1, 8)
    payloads = [schema.encode(r) for r in reports]

    def cpu(f: Callable[[], object]) -> float:
        c = time.process_time()
        f()
        return (time.process_time() - c) / n * 1e6

    print(f"{n} reports of {len(payloads[0])} B, {per} per node: collector CPU us/report")
    print(f"  decode alone                {cpu(lambda: [schema.decode(x) for x in payloads]):6.2f}")
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind("inproc://collector-cost")
    tmp = tempfile.mkdtemp()

    def collector(trace: bool) -> Collector:
        col = Collector(token=b"t")
        if trace:
            col.trace = TraceWriter(
                Path(tmp) / f"{time.time_ns()}.zstrace",
                thinning=ThinningPolicy(),
                commit_interval=1e9,
                commit_rows=10**9,
            )
            for r in range(n):
                h = Hello(schema_version=2, job_id="b", rank=r, world_size=n, node_rank=r // per)
                col._publish(h, schema.encode(h), None)
            col.trace.commit()
        return col

    for trace in (False, True):
        col = collector(trace)

        def direct(col: Collector = col) -> None:
            for x in payloads:
                col.ingest([b"t", x], pub)
            if col.trace is not None:
                col.trace.commit()

        frames: list[list[bytes]] = []

        def relay_side(frames: list[list[bytes]] = frames) -> None:
            for i in range(0, n, per):
                b = NodeBatcher(i // per, "h")
                for r, x in zip(reports[i : i + per], payloads[i : i + per], strict=True):
                    b.add(r, x)
                frames.append(b.take()[0])

        col2 = collector(trace)

        def batched(col: Collector = col2, frames: list[list[bytes]] = frames) -> None:
            for header, body in frames:
                batch = schema.decode_batch(header)
                parts, at = [], 0
                for e in batch.entries:
                    parts.append(body[at : at + e.size])
                    at += e.size
                col._take(batch, parts, body, pub)
            if col.trace is not None:
                col.trace.commit()

        d, relay, b = cpu(direct), cpu(relay_side), cpu(batched)
        print(
            f"  trace {'on ' if trace else 'off'}: direct {d:6.2f}, batched {b:6.2f} (x{b / d:.2f})"
            f"; the relay's fold and header {relay:.2f} on the node, besides its decode"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
