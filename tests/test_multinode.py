"""Multi-node collection: node 0 hosts the job's one collector; other nodes' ranks report to it
with the job token. Simulated with two ``zeroscope run --nnodes 2`` launches on this machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from zeroscope.remote.multinode import (
    advertised_address,
    local_ingest_address,
    plan_collector,
    read_token_file,
)
from zeroscope.remote.ssh import free_port
from zeroscope.store.trace import TraceReader

JOB = Path(__file__).parent / "jobs" / "paced_job.py"
STEP_LINE = re.compile(r"^step\s+(\d+)\s.*ranks (\d+)")


def test_single_node_plan_hosts_on_loopback_with_a_token() -> None:
    plan = plan_collector(environ={})
    assert plan.hosts_collector and plan.bind_host == "127.0.0.1" and plan.port == 0
    assert len(plan.token) == 32
    env = plan.rank_env("tcp://127.0.0.1:5000")
    assert env["ZEROSCOPE_COLLECTOR"] == "tcp://127.0.0.1:5000"
    assert env["ZEROSCOPE_TOKEN"] == plan.token


def test_node0_binds_where_others_reach_it_and_others_send_there() -> None:
    env = {"ZEROSCOPE_TOKEN": "tok"}
    kw = dict(nnodes=2, master_addr="10.1.2.3", master_port=29500, environ=env)
    host = plan_collector(node_rank=0, **kw)  # type: ignore[arg-type]
    assert (host.hosts_collector, host.bind_host, host.port) == (True, "0.0.0.0", 29501)
    # its own ranks use loopback even though it listens on every interface
    assert host.rank_env("tcp://0.0.0.0:29501")["ZEROSCOPE_COLLECTOR"] == "tcp://127.0.0.1:29501"
    other = plan_collector(node_rank=1, **kw)  # type: ignore[arg-type]
    assert not other.hosts_collector
    assert other.rank_env() == {
        "ZEROSCOPE_COLLECTOR": "tcp://10.1.2.3:29501",
        "ZEROSCOPE_TOKEN": "tok",
        "ZEROSCOPE_JOB_ID": "10.1.2.3-29500",
    }
    assert host.job_id == other.job_id  # both nodes name the job alike without talking
    loop = plan_collector(node_rank=0, nnodes=2, master_addr="127.0.0.1", environ=env)
    assert loop.bind_host == "127.0.0.1"


def test_multi_node_without_a_shared_token_is_refused() -> None:
    with pytest.raises(ValueError, match="needs the same ZEROSCOPE_TOKEN on every node"):
        plan_collector(nnodes=2, node_rank=1, master_addr="n0", environ={})
    with pytest.raises(ValueError, match=r"--node-rank 2 is outside 0\.\.1"):
        plan_collector(nnodes=2, node_rank=2, environ={"ZEROSCOPE_TOKEN": "t"})


def test_token_file_created_private_by_node0_and_read_by_others(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "job.token"
    with pytest.raises(ValueError, match="did not appear"):
        read_token_file(path, create=False, wait_s=0.1)
    a = plan_collector(nnodes=2, node_rank=0, master_addr="n0", token_file=path, environ={})
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    b = plan_collector(nnodes=2, node_rank=1, master_addr="n0", token_file=path, environ={})
    assert a.token == b.token and len(a.token) == 32


def test_addresses() -> None:
    assert advertised_address("0.0.0.0", 7, "gpu-01") == "tcp://gpu-01:7"
    assert advertised_address("10.0.0.5", 7) == "tcp://10.0.0.5:7"
    assert local_ingest_address("tcp://10.0.0.5:7") == "tcp://10.0.0.5:7"


def _run_node(
    node_rank: int,
    master_port: int,
    port: int,
    stop: Path,
    trace: Path,
    env: dict[str, str],
    relay: bool = False,
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "zeroscope", "run", "--headless", "--nnodes", "2",
         *(["--relay"] if relay else []),
         "--node-rank", str(node_rank), "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
         "--master-port", str(master_port), "--port", str(port), "--record", str(trace),
         str(JOB), str(stop), "0.05"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("relay", [False, True], ids=["direct", "through a node relay"])
def test_two_node_run_shows_every_rank_of_both_nodes(tmp_path: Path, relay: bool) -> None:
    env = {
        **os.environ,
        "ZEROSCOPE_HOME": str(tmp_path / "zh"),
        "ZEROSCOPE_TOKEN": "feedface" * 4,
        "OMP_NUM_THREADS": "1",
    }
    env.pop("ZEROSCOPE_JOB_ID", None)
    stop, trace = tmp_path / "stop", tmp_path / "job.zstrace"
    master, port = free_port(), free_port()
    node1 = _run_node(1, master, port, stop, tmp_path / "unused.zstrace", env, relay)  # any order
    node0 = _run_node(0, master, port, stop, trace, env)
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(x.rstrip() for x in node0.stdout), daemon=True
    )  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 90
        while not any((m := STEP_LINE.match(x)) and int(m[1]) >= 3 for x in list(lines)):
            assert time.monotonic() < deadline, "\n".join(lines)
            assert node0.poll() is None, "\n".join(lines)
            time.sleep(0.1)
        stop.touch()
        assert node0.wait(timeout=60) == 0, "\n".join(lines)
        out1, _ = node1.communicate(timeout=60)
        assert node1.returncode == 0, out1
    finally:
        stop.touch()
        for p in (node0, node1):
            if p.poll() is None:
                p.kill()
                p.wait()
    reader.join(5)
    steps = [(int(m[1]), int(m[2])) for x in lines if (m := STEP_LINE.match(x))]
    assert steps and all(ranks == 2 for _, ranks in steps), "\n".join(lines)
    first, last = steps[0][0], steps[-1][0]
    assert [s for s, _ in steps] == list(range(first, last + 1)) and first <= 1
    assert "ranks on this node report to tcp://127.0.0.1:" in out1
    assert ("report through the node relay at tcp://127.0.0.1:" in out1) == relay
    assert not (tmp_path / "unused.zstrace").exists()  # node 1 hosts no collector
    with TraceReader(trace) as r:
        hellos = r.hellos()
        assert r.steps() == (first, last)  # the view missed no recorded step
    assert sorted((h.rank, h.node_rank) for h in hellos) == [(0, 0), (1, 1)]
    assert {h.job_id for h in hellos} == {f"127.0.0.1-{master}"}
    assert trace.stat().st_mode & 0o777 == 0o600  # the trace is private from its creation


def test_run_flags_without_static_rendezvous_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from argparse import Namespace

    monkeypatch.setenv("ZEROSCOPE_TOKEN", "t")
    from zeroscope.remote.multinode import plan_from_run_args

    base = dict(nnodes="2", master_port=None, port=0)
    with pytest.raises(ValueError, match="needs --node-rank and --master-addr"):
        plan_from_run_args(Namespace(node_rank=None, master_addr=None, **base))
    plan = plan_from_run_args(Namespace(node_rank="1", master_addr="n0", **base))
    assert plan.connect_address == "tcp://n0:29501"
    assert plan_from_run_args(
        Namespace(nnodes="1:1", node_rank=None, master_addr=None, port=0)
    ).hosts_collector
