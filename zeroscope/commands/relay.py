"""``zeroscope relay``: one node's relay to the job's collector (zeroscope/collector/relay.py).

    zeroscope relay --collector tcp://node0:29501 --port 29601 --node-rank 3

Run one per node, before or after the node's ranks start (ZeroMQ connects lazily and retries),
with the job's token in ``ZEROSCOPE_TOKEN`` or ``--token-file``; then point the node's ranks at
it: ``ZEROSCOPE_COLLECTOR=tcp://127.0.0.1:29601``. It prints that export line, forwards until
SIGTERM or Ctrl-C, and says on exit what it forwarded and what it could not queue.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from zeroscope.cli import CliError
from zeroscope.collector.relay import BUFFER, Relay
from zeroscope.remote.multinode import COLLECTOR_ENV, TOKEN_ENV, is_loopback, read_token_file

HELP = "forward one node's ranks to the job's collector over one connection"

NODE_RANK_ENVS = ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID")
"""Where a launcher says which node this is (torchrun's agent, torchrun's workers, SLURM)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--collector",
        metavar="ADDRESS",
        help=f"the collector's ingest address, tcp://HOST:PORT (default: ${COLLECTOR_ENV})",
    )
    parser.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="HOST",
        help="interface the node's ranks connect to (default 127.0.0.1: ranks on this node)",
    )
    parser.add_argument("--port", type=int, default=0, help="port for the ranks (default: free)")
    parser.add_argument(
        "--node-rank",
        type=int,
        help="this node's index (default: $NODE_RANK, $GROUP_RANK or $SLURM_NODEID, else 0)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help=f"read the job token here (else ${TOKEN_ENV})",
    )
    parser.add_argument(
        "--buffer",
        type=int,
        default=BUFFER,
        help=f"batches (of up to 64 reports) held while the collector is away (default {BUFFER})",
    )


def node_rank_of(args: argparse.Namespace) -> int:
    if args.node_rank is not None:
        return int(args.node_rank)
    for name in NODE_RANK_ENVS:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def main(args: argparse.Namespace) -> int:
    collector = args.collector or os.environ.get(COLLECTOR_ENV, "")
    if not collector.startswith("tcp://"):
        raise CliError(f"--collector tcp://HOST:PORT is required (or ${COLLECTOR_ENV})")
    if args.token_file is not None:
        try:
            token = read_token_file(args.token_file, create=False, wait_s=0)
        except OSError as exc:
            raise CliError(f"cannot read token file {args.token_file}: {exc}") from None
    else:
        token = os.environ.get(TOKEN_ENV, "")
    if not token and not is_loopback(args.bind):
        raise CliError(
            f"refusing to bind the relay on {args.bind!r} without a token: anyone who can reach "
            f"it could inject reports. Set ${TOKEN_ENV} (the job's token) or --token-file."
        )
    relay = Relay(
        collector,
        bind_host=args.bind,
        port=args.port,
        token=token.encode(),
        node_rank=node_rank_of(args),
        buffer=args.buffer,
    )
    try:
        relay.start()
    except OSError as exc:
        raise CliError(str(exc)) from None
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        done.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    print(f"export {COLLECTOR_ENV}={relay.address}", flush=True)
    print(
        f"zeroscope relay: node {relay.node_rank} forwarding to {collector}",
        file=sys.stderr,
        flush=True,
    )
    try:
        done.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        relay.stop()
    refused = sum(relay.gate.refused.values())
    print(
        f"zeroscope relay: node {relay.node_rank}: {relay.forwarded} messages forwarded "
        f"({relay.node_batches} node batches), "
        f"{len(relay.hellos)} ranks, {refused} connections refused, "
        f"{relay.local_dropped} own messages not queued",
        file=sys.stderr,
        flush=True,
    )
    return 0
