"""Direct vs relayed ingest at 1,024 / 4,096 / 16,384 synthetic ranks, side by side in one run.

The collector (this process, recording a trace) takes the same reports twice per size: from the
ranks' senders directly, and through one ``zeroscope relay`` per node (zeroscope/collector/relay.py).
Reported per path: records per CPU-second of the collector's process (its thread, the trace
writer's and ZeroMQ's I/O thread: nothing else runs here while it ingests), the ratio relayed /
direct, reports lost (sent by the senders minus StepReports the collector accepted, plus what
the senders dropped), the collector's RSS after the run, the node batches it took whole
(collector/batch_ingest.py), and the slowest step's sending time (past ``--interval``, the
senders did not keep the schedule).

The senders are the agent's real :class:`~zeroscope.agent.publish.Publisher` (encode, batch,
non-blocking send), in ``--procs`` spawned processes standing for the nodes, each Publisher
carrying the reports of one node's ranks (``--per-node``; a real node has one per rank: 16,384
sockets and their file descriptors do not fit one 2-core machine), but sending each rank's report
as its own ZeroMQ message, as each rank's sender does. Relays live in the sender
processes, one per node, as on a real node. Each step is sent at once, then the senders wait
for the next tick (``--interval``): a job's steps, not a flood.

Usage: ``python bench/relay_ingest.py [--sizes 1024,4096,16384] [--steps 3]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOKEN = b"bench-relay-token"


def _reports(ranks: range, step: int, collectives: int) -> list[Any]:
    from zeroscope.agent.schema import Collective, MemoryBytes, Phases, StepReport

    return [
        StepReport(
            rank=rank,
            step=step,
            wall_ns=time.time_ns(),
            duration_s=0.5,
            phases=Phases(data=0.001, forward=0.1, backward=0.2, optimizer=0.05),
            memory=MemoryBytes(params=2**30, grads=2**29, optim=2**32, activations=2**31),
            collectives=[
                Collective(
                    op="all_gather",
                    nbytes=2**24 + i,
                    group_size=8,
                    start_s=0.0,
                    duration_s=2e-3,
                    exposed_s=1e-3,
                )
                for i in range(collectives)
            ],
        )
        for rank in ranks
    ]


def _node_sender(
    address: str,
    nodes: list[int],
    per_node: int,
    world: int,
    relayed: bool,
    steps: int,
    interval: float,
    collectives: int,
    go: Any,
    out: Any,
) -> None:
    """One sender process: a Publisher per node (and that node's relay when ``relayed``)."""
    from zeroscope.agent import schema
    from zeroscope.agent.publish import Publisher
    from zeroscope.agent.schema import Hello, SenderClaim
    from zeroscope.collector.relay import Relay

    relays = [Relay(address, token=TOKEN, node_rank=n).start() for n in nodes] if relayed else []
    pubs = []
    for i, node in enumerate(nodes):
        target = relays[i].address if relayed else address
        pub = Publisher(target, TOKEN, claim=SenderClaim(rank=node * per_node, node_rank=node))
        pub.set_sticky(
            Hello(
                schema_version=schema.SCHEMA_VERSION,
                job_id="bench",
                rank=node * per_node,
                world_size=world,
                node_rank=node,
                local_world_size=per_node,
            )
        )
        pubs.append(pub)
    for pub in pubs:
        pub.wait_connected(30)
    out.put(("ready", 0, 0, 0.0))
    go.wait()
    import msgspec

    # Each rank's report is built once; a step only renumbers it (the senders' own CPU: on a
    # 2-core machine it is what keeps the schedule).
    base = {n: _reports(range(n * per_node, (n + 1) * per_node), 0, collectives) for n in nodes}
    sent = 0
    slowest = 0.0
    tick = time.monotonic()
    for step in range(1, steps + 1):
        for node, pub in zip(nodes, pubs, strict=True):
            now = time.time_ns()
            batch = [msgspec.structs.replace(r, step=step, wall_ns=now) for r in base[node]]
            # One ZeroMQ message per rank and step, as each rank's own sender makes it.
            sent += sum(pub.send(report) for report in batch)
        # From the step's tick to its last report sent: past ``interval``, the schedule slipped.
        slowest = max(slowest, time.monotonic() - tick)
        tick += interval
        time.sleep(max(0.0, tick - time.monotonic()))
    time.sleep(0.5)
    out.put(("done", sent, sum(p.dropped for p in pubs), slowest))
    for pub in pubs:
        pub.close()
    time.sleep(1.0)  # what the relays still hold goes out
    for relay in relays:
        relay.stop()


def _rss_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _next(out: Any, procs: list[Any], timeout: float) -> tuple[str, int, int, float]:
    """The next sender message; fails at once when a sender died instead."""
    import queue

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=1.0)  # type: ignore[no-any-return]
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                raise RuntimeError("a sender process failed (see its traceback above)") from None
    raise TimeoutError("senders did not answer")


def run_one(ranks: int, relayed: bool, args: argparse.Namespace, trace: Path) -> dict[str, Any]:
    """One path at one size: the collector's records per CPU-second, losses, RSS."""
    from zeroscope.collector.server import Collector, wait_for

    nodes = max(1, ranks // args.per_node)
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    with Collector(record=trace, token=TOKEN) as col:
        # No in-process listener: it would take decoded messages (collector/batch_ingest.py),
        # and a remote viewer's path is the PUB socket, which the collector feeds either way.
        counted = [0]
        groups = [list(range(nodes))[i :: args.procs] for i in range(min(args.procs, nodes))]
        procs = [
            ctx.Process(
                target=_node_sender,
                args=(
                    *(col.ingest_address, group, args.per_node, ranks, relayed, args.steps),
                    *(args.interval, args.collectives, go, out),
                ),
            )
            for group in groups
        ]
        for p in procs:
            p.start()
        for _ in procs:
            assert _next(out, procs, 120)[0] == "ready"
        cpu0, t0 = time.process_time(), time.perf_counter()
        go.set()
        sent = dropped = 0
        slowest = 0.0
        for _ in procs:
            _, s, d, late = _next(out, procs, 600)
            sent, dropped, slowest = sent + s, dropped + d, max(slowest, late)
        wait_for(lambda: col.reports >= sent, 60, 0.05)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        counted[0] = col.reports
        for p in procs:
            p.join(60)
        records = counted[0] * (args.collectives + 1)
        return {
            "ranks": ranks,
            "path": "relayed" if relayed else "direct",
            "connections": nodes,
            "sent": sent,
            "received": counted[0],
            "lost": sent - counted[0] + dropped,
            "collector_cpu_s": cpu,
            "wall_s": wall,
            "records_per_cpu_s": records / cpu if cpu > 0 else None,
            "cpu_per_step_ms": cpu / args.steps * 1e3,
            "rss_bytes": _rss_bytes(),
            "rejected": sum(col.rejected.values()),
            "node_batches": col.batches,
            "slowest_step_send_s": slowest,
            "on_schedule": slowest <= args.interval,
        }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,4096,16384")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--paths", default="direct,relayed", help="direct, relayed or both")
    p.add_argument("--interval", type=float, default=1.0, help="seconds per step")
    p.add_argument("--per-node", type=int, default=64, help="ranks per node (one sender each)")
    p.add_argument("--procs", type=int, default=2, help="sender processes")
    p.add_argument("--collectives", type=int, default=8, help="records per report - 1")
    return p


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in (int(s) for s in args.sizes.split(",")):
            for relayed in [p == "relayed" for p in args.paths.split(",")]:
                trace = Path(tmp) / f"{ranks}-{relayed}.zst"
                row = run_one(ranks, relayed, args, trace)
                row["load_avg"] = round(os.getloadavg()[0], 2)
                rows.append(row)
    return rows


def main() -> int:
    args = parser().parse_args()
    rows = run(args)
    direct: dict[int, float] = {}
    print(
        f"{args.steps} steps at {args.interval:g} s, {args.per_node} ranks per node (one sender "
        f"and, relayed, one relay each), {args.collectives + 1} records per report"
    )
    for r in rows:
        rate = r["records_per_cpu_s"] or 0.0
        if r["path"] == "direct":
            direct[r["ranks"]] = r["cpu_per_step_ms"]
        base = direct.get(r["ranks"])
        ratio = r["cpu_per_step_ms"] / base if base else float("nan")
        print(
            f"{r['ranks']:>6} ranks {r['path']:>8}: {rate / 1e6:5.2f} M records/CPU-s, collector "
            f"CPU {r['cpu_per_step_ms']:7.1f} ms/step (x{ratio:.2f} of direct), sent "
            f"{r['sent']}, received {r['received']}, lost {r['lost']}, RSS "
            f"{(r['rss_bytes'] or 0) / 2**20:.0f} MiB, {r['wall_s']:.0f} s wall, load {r['load_avg']}, "
            f"{r['node_batches']} node batches, slowest step sent in {r['slowest_step_send_s']:.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
