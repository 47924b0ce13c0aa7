"""Where the ranks of a multi-node job send their reports: one collector, on node 0.

Design (docs/remote.md): torchrun already makes every node agree on ``--master-addr`` (node
0's address) and ``--master-port``. ``zeroscope run --nnodes N --node-rank K`` uses the same
agreement: node 0 starts the job's only collector on ``master_port + 1`` (or
``--collector-port``) and every other node points its ranks straight at it, with the job's
token. No relay, no extra rendezvous: the rank-to-collector path is ZeroMQ PUSH, which
connects lazily and retries, so it does not matter which node starts first.

The token is the one thing nodes must share out of band, because anything derived from the
public rendezvous (address, port, run id) would let anybody on the network forge reports:
``ZEROSCOPE_TOKEN`` in every node's environment (schedulers propagate it), or a
``--token-file`` on a shared filesystem that node 0 creates (0600) and the others wait for.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from zeroscope.remote.discovery import new_job_id, new_token, write_private

TOKEN_ENV = "ZEROSCOPE_TOKEN"
JOB_ID_ENV = "ZEROSCOPE_JOB_ID"
COLLECTOR_ENV = "ZEROSCOPE_COLLECTOR"
TOKEN_FILE_WAIT_S = 120.0


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and ``localhost``; anything else (0.0.0.0 included) is exposed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(kw_only=True, slots=True)
class CollectorPlan:
    """What one node's ``zeroscope run`` does about collection."""

    hosts_collector: bool
    """Node 0 (or a single-node job): start the collector here."""
    bind_host: str
    port: int
    """0 = any free port (single node)."""
    connect_address: str | None
    """Where this node's ranks send: None on the hosting node (use the collector's own
    ``ingest_address``), ``tcp://MASTER:PORT`` elsewhere."""
    token: str
    job_id: str
    node_rank: int = 0

    def rank_env(self, ingest_address: str | None = None) -> dict[str, str]:
        """The environment this node's ranks need (``ZEROSCOPE_COLLECTOR``/``_TOKEN``/``_JOB_ID``)."""
        address = self.connect_address or (
            local_ingest_address(ingest_address) if ingest_address else None
        )
        if address is None:
            raise ValueError("the hosting node needs its collector's ingest address")
        return {COLLECTOR_ENV: address, TOKEN_ENV: self.token, JOB_ID_ENV: self.job_id}


def read_token_file(path: Path, *, create: bool, wait_s: float = TOKEN_FILE_WAIT_S) -> str:
    """The token in ``path``; node 0 creates it (0600) when missing, others wait for it."""
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, (new_token() + "\n").encode())
    deadline = time.monotonic() + wait_s
    while True:
        try:
            token = path.read_text().strip()
            if token:
                return token
        except FileNotFoundError:
            pass
        if time.monotonic() >= deadline:
            raise ValueError(
                f"token file {path} did not appear within {wait_s:.0f} s (node 0 creates it)"
            )
        time.sleep(0.2)


def plan_collector(
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    collector_port: int | None = None,
    token_file: Path | None = None,
    environ: dict[str, str] | None = None,
) -> CollectorPlan:
    """Decide, from torchrun's own flags, whether this node hosts the collector and where its
    ranks send. ValueError (one line) for what a user must fix."""
    env = dict(os.environ if environ is None else environ)
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank {node_rank} is outside 0..{nnodes - 1} (--nnodes {nnodes})")
    if nnodes == 1:
        job_id = env.get(JOB_ID_ENV) or new_job_id()
        token = env.get(TOKEN_ENV) or new_token()
        return CollectorPlan(
            hosts_collector=True,
            bind_host="127.0.0.1",
            port=collector_port or 0,
            connect_address=None,
            token=token,
            job_id=job_id,
        )
    # Every node must name the job alike without talking: derive it from the rendezvous.
    job_id = env.get(JOB_ID_ENV) or re.sub(r"[^A-Za-z0-9_.-]", "_", f"{master_addr}-{master_port}")
    if token_file is not None:
        token = read_token_file(token_file, create=node_rank == 0)
    elif env.get(TOKEN_ENV):
        token = env[TOKEN_ENV]
    else:
        raise ValueError(
            "a multi-node job needs the same ZEROSCOPE_TOKEN on every node "
            "(export ZEROSCOPE_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))') "
            "before launching) or --token-file on a shared filesystem"
        )
    port = collector_port or master_port + 1
    if not 0 < port < 65536:
        raise ValueError(f"collector port {port} is not a TCP port")
    if node_rank == 0:
        # Others reach us at master_addr: listen there (all interfaces unless it is loopback,
        # where a one-machine simulation needs nothing more). The token guards the port.
        bind = "127.0.0.1" if is_loopback(master_addr) else "0.0.0.0"
        return CollectorPlan(
            hosts_collector=True,
            bind_host=bind,
            port=port,
            connect_address=None,
            token=token,
            job_id=job_id,
        )
    host = master_addr if ":" not in master_addr else f"[{master_addr}]"
    return CollectorPlan(
        hosts_collector=False,
        bind_host="",
        port=port,
        connect_address=f"tcp://{host}:{port}",
        token=token,
        job_id=job_id,
        node_rank=node_rank,
    )


def advertised_address(bind_host: str, port: int, advertise: str | None = None) -> str:
    """The ``tcp://HOST:PORT`` other machines use for a collector bound to ``bind_host``."""
    host = advertise or (bind_host if bind_host not in ("0.0.0.0", "::", "*") else socket.getfqdn())
    if ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def _int_flag(value: object, default: int, name: str) -> int:
    """torchrun flags arrive as strings; ``--nnodes MIN:MAX`` counts as MAX nodes."""
    if value is None or value == "":
        return default
    text = str(value).rpartition(":")[2]
    if not text.isdigit():
        raise ValueError(f"{name} must be a number, got {value!r}")
    return int(text)


def plan_from_run_args(args: object) -> CollectorPlan:
    """:func:`plan_collector` from ``zeroscope run``'s parsed torchrun flags (``--nnodes``,
    ``--node-rank``, ``--master-addr``, ``--master-port``, ``--port``, ``--token-file``)."""
    port = getattr(args, "port", 0) or None
    token_file = getattr(args, "token_file", None)
    nnodes = _int_flag(getattr(args, "nnodes", None), 1, "--nnodes")
    if getattr(args, "no_ssh", False):
        nnodes = _no_ssh_nodes(args)
    if nnodes > 1 and (
        getattr(args, "node_rank", None) is None or not getattr(args, "master_addr", None)
    ):
        # With c10d rendezvous torchrun assigns node ranks itself: "node 0" is unknown here.
        raise ValueError(
            "a multi-node zeroscope run needs --node-rank and --master-addr (node 0 hosts the "
            "collector); with --rdzv-backend c10d run zeroscope serve --bind 0.0.0.0 on one node "
            "and give the others its ZEROSCOPE_COLLECTOR and ZEROSCOPE_TOKEN"
        )
    return plan_collector(
        nnodes=nnodes,
        node_rank=_int_flag(getattr(args, "node_rank", None), 0, "--node-rank"),
        master_addr=getattr(args, "master_addr", None) or "127.0.0.1",
        master_port=_int_flag(getattr(args, "master_port", None), 29500, "--master-port"),
        collector_port=port,
        token_file=Path(token_file) if token_file else None,
    )


def _no_ssh_nodes(args: object) -> int:
    """DeepSpeed's launcher with ``--no_ssh``: every node runs ``zeroscope run --no_ssh
    --node_rank N`` itself, as torchrun's nodes do, and ``--num_nodes`` says how many (DeepSpeed
    takes that many hosts of the hostfile); node 0 hosts the collector."""
    node_rank = _int_flag(getattr(args, "node_rank", None), 0, "--node_rank")
    num_nodes = getattr(args, "num_nodes", None)
    if num_nodes is None or str(num_nodes) == "-1":
        if node_rank > 0:
            raise ValueError(
                "a multi-node --no_ssh zeroscope run needs --num_nodes (how many nodes run the "
                "job; node 0 hosts the collector)"
            )
        return 1
    return _int_flag(num_nodes, 1, "--num_nodes")


def local_ingest_address(ingest_address: str) -> str:
    """The address this node's own ranks use for a collector bound to all interfaces."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://[::]:", "tcp://*:"):
        if ingest_address.startswith(wildcard):
            return "tcp://127.0.0.1:" + ingest_address[len(wildcard) :]
    return ingest_address


def nnodes_of(args: object) -> int:
    return _int_flag(getattr(args, "nnodes", None), 1, "--nnodes")


class WorkerJob(Protocol):
    """What :func:`run_worker_node` needs of zeroscope.run.launch.Job."""

    @property
    def returncode(self) -> int | None: ...
    def signal(self, sig: int) -> None: ...
    def exit_code(self) -> int: ...


def run_worker_node(job: WorkerJob, plan: CollectorPlan) -> int:
    """A node other than 0: no collector and no view here, just the job (its own process
    group, as on node 0), Ctrl-C/SIGTERM passed on; torchrun's exit code is ours. The console
    says where the ranks report and whether the collector admits them (agent/collector_probe.py).

    The one place the launcher side imports the agent's runtime: the probe connects exactly as
    this node's ranks do (tests/test_layering.py names this exemption)."""
    from zeroscope.agent.collector_probe import CollectorProbe

    print(
        f"zeroscope: ranks on this node report to {plan.connect_address} "
        f"(job {plan.job_id}; the view is on node 0)",
        file=sys.stderr,
        flush=True,
    )
    interrupts = 0

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal interrupts
        interrupts += 1
        job.signal(signal.SIGINT if interrupts == 1 else signal.SIGKILL)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    probe = CollectorProbe(plan.connect_address or "", plan.token, plan.node_rank)
    try:
        while job.returncode is None:
            probe.poll(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        probe.close()
    return job.exit_code()
