"""Two nodes on two real network namespaces joined by a veth pair: node 0 at one
address, node 1 at another, each a ``zeroscope run --nnodes 2`` (or plain torchrun), training the
same small data-parallel job. With the shared token node 0 shows both ranks; with a wrong token,
an unreachable collector port, or node 1 launched without zeroscope, node 0's end-of-run lines
and ``summary --json`` name rank 1 with the reason, node 1's console says what happened to it,
and the training's losses are the same in every case.

Needs root (``ip netns add``, a veth pair: Debian's iproute2, which .ci/run installs). Where the
namespaces cannot be built (a container without CAP_SYS_ADMIN/CAP_NET_ADMIN) the tests are
skipped, with the failing command and its error as the reason; the building itself is the probe.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

JOB = Path(__file__).parent / "jobs" / "regression_job.py"
STEPS = 8
STEP_LINE = re.compile(r"^step\s+(\d+)\s.*ranks (\d+)")
TOKEN = "feedface" * 4


@dataclass(frozen=True)
class TwoHosts:
    ns: tuple[str, str]
    ip: tuple[str, str]
    dev: tuple[str, str]


def _sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)


def _build(tag: str, octet: int) -> TwoHosts:
    """Create the pair, or raise RuntimeError naming the command that failed and why."""
    hosts = TwoHosts(
        ns=(f"{tag}n0", f"{tag}n1"),
        ip=(f"10.251.{octet}.1", f"10.251.{octet}.2"),
        dev=(f"{tag}v0", f"{tag}v1"),
    )
    (n0, n1), (d0, d1) = hosts.ns, hosts.dev
    steps = [
        ("ip", "netns", "add", n0),
        ("ip", "netns", "add", n1),
        ("ip", "link", "add", d0, "netns", n0, "type", "veth", "peer", "name", d1, "netns", n1),
    ]
    for ns, dev, ip in zip(hosts.ns, hosts.dev, hosts.ip, strict=True):
        steps += [
            ("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev),
            ("ip", "-n", ns, "link", "set", dev, "up"),
            ("ip", "-n", ns, "link", "set", "lo", "up"),
        ]
    for cmd in steps:
        done = _sh(*cmd)
        if done.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(cmd)}` failed: {done.stderr.strip() or done.returncode}"
            )
    # The real probe: a TCP connection from node 1's namespace to a listener in node 0's.
    listen = (
        "import socket,sys;s=socket.create_server((sys.argv[1],29400));print('up',flush=True);"
        "c,_=s.accept();c.sendall(b'ok')"
    )
    server = subprocess.Popen(
        ["ip", "netns", "exec", n0, sys.executable, "-c", listen, hosts.ip[0]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "up":
            raise RuntimeError(f"`ip netns exec {n0} python` failed: {server.communicate()[1]}")
        connect = "import socket,sys;print(socket.create_connection((sys.argv[1],29400),5).recv(2))"
        done = _sh("ip", "netns", "exec", n1, sys.executable, "-c", connect, hosts.ip[0])
        if "b'ok'" not in done.stdout:
            raise RuntimeError(f"node 1 cannot reach node 0 over the veth: {done.stderr.strip()}")
    finally:
        server.kill()
        server.wait()
    return hosts


def _tear_down(tag: str) -> None:
    for ns in (f"{tag}n0", f"{tag}n1"):
        _sh("ip", "netns", "del", ns)  # takes its end of the veth pair with it


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[TwoHosts]:
    if os.geteuid() != 0:
        pytest.skip("two network namespaces need root (ip netns add); run as root to test this")
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed (.ci/run installs it)")
    tag = f"zs{os.getpid() % 100000}"
    try:
        hosts = _build(tag, os.getpid() % 250)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        _tear_down(tag)
        pytest.skip(f"cannot build two network namespaces here: {exc}")
    try:
        yield hosts
    finally:
        _tear_down(tag)


def _env(tmp: Path, dev: str, token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROSCOPE_")}
    env.update(ZEROSCOPE_HOME=str(tmp / "home"), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=dev)
    if token is not None:
        env["ZEROSCOPE_TOKEN"] = token
    return env


def _launch(
    hosts: TwoHosts, node: int, how: str, tmp: Path, master_port: int, token: str | None
) -> subprocess.Popen[str]:
    rendezvous = [
        "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
        "--master-addr", hosts.ip[0], "--master-port", str(master_port),
    ]  # fmt: skip
    if how == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", *rendezvous]
    else:
        port = master_port + (5 if how == "wrong-port" else 1)
        argv = [sys.executable, "-m", "zeroscope", "run", "--headless", *rendezvous,
                "--port", str(port), "--record", str(tmp / f"node{node}.zstrace")]  # fmt: skip
    return subprocess.Popen(
        ["ip", "netns", "exec", hosts.ns[node], *argv, str(JOB), str(tmp), str(STEPS), "0.2"],
        env=_env(tmp, hosts.dev[node], token),
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@dataclass
class TwoNodeJob:
    """Node 0 under ``zeroscope run``, node 1 as ``how`` says (``zeroscope``, ``wrong-port``
    or ``torchrun``), in its own folder and on its own ports."""

    folder: Path
    procs: tuple[subprocess.Popen[str], subprocess.Popen[str]]

    @classmethod
    def start(
        cls, hosts: TwoHosts, folder: Path, master_port: int, how: str, token1: str | None
    ) -> TwoNodeJob:
        folder.mkdir()
        first = _launch(hosts, 1, how, folder, master_port, token1)  # the order is free
        zero = _launch(hosts, 0, "zeroscope", folder, master_port, TOKEN)
        return cls(folder, (zero, first))

    def finish(self) -> tuple[list[str], list[str], dict]:
        """Both nodes' output (each must exit 0) and node 0's ``summary --json``."""
        outs = []
        try:
            for node, proc in enumerate(self.procs):
                out, _ = proc.communicate(timeout=400)
                (self.folder / f"node{node}.out").write_text(out)  # for a post-mortem
                assert proc.returncode == 0, out
                outs.append(out.splitlines())
        finally:
            self.kill()
        trace = self.folder / "node0.zstrace"
        summary = subprocess.run(
            [sys.executable, "-m", "zeroscope", "summary", "--json", str(trace)],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        assert not (self.folder / "node1.zstrace").exists()  # node 1 hosts no collector
        return outs[0], outs[1], json.loads(summary.stdout)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _losses(tmp: Path) -> dict[tuple[int, int], str]:
    """(rank, step) -> loss as the job wrote it (full precision text)."""
    out = {}
    for rank in (0, 1):
        for line in (tmp / f"loss-rank{rank}.txt").read_text().splitlines():
            step, loss = line.split()
            out[rank, int(step)] = loss
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_missing_ranks_are_named_across_two_network_namespaces(
    two_hosts: TwoHosts, tmp_path: Path
) -> None:
    ip0, ip1 = two_hosts.ip
    cases = {
        # node 1's launch, its token, rank 1's reason on node 0, what node 1's console says
        "shared": ("zeroscope", TOKEN, None, None, rf"collector at tcp://{ip0}:\d+ admitted this"),
        "wrong-token": (
            "zeroscope", "0" * 32, "unauthenticated",
            rf"its reports were refused: wrong ZEROSCOPE_TOKEN \(1 connection from {ip1}\)",
            r"refused this node: wrong token",
        ),
        "wrong-port": (
            "wrong-port", TOKEN, "unheard", r"nothing heard from it",
            rf"did not reach the collector at tcp://{ip0}:\d+ \(nothing answers",
        ),
        "torchrun": ("torchrun", None, "unheard", r"nothing heard from it", None),
    }  # fmt: skip
    # All four jobs at once (own folders, own ports): their waits overlap on a small machine.
    jobs = {}
    try:
        for i, (name, (how, token1, *_)) in enumerate(cases.items()):
            jobs[name] = TwoNodeJob.start(two_hosts, tmp_path / name, 29500 + 10 * i, how, token1)
        results = {name: job.finish() for name, job in jobs.items()}
    finally:
        for job in jobs.values():
            job.kill()

    node0, node1, summary = results["shared"]
    # The shared token: every step of both ranks, nothing missing.
    steps = [(int(m[1]), int(m[2])) for x in node0 if (m := STEP_LINE.match(x))]
    assert [s for s, _ in steps] == list(range(1, STEPS + 1)), node0
    assert all(ranks == 2 for _, ranks in steps), node0
    assert not [line for line in node0 if line.lstrip().startswith("missing")], node0
    assert summary["missing_ranks"] == [] and [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert f"zeroscope: ranks on this node report to tcp://{ip0}:29501" in "\n".join(node1)
    reference = _losses(tmp_path / "shared")
    assert sorted(reference) == [(r, s) for r in (0, 1) for s in range(1, STEPS + 1)]

    for name, (_, _, reason, why, console) in cases.items():
        node0, node1, summary = results[name]
        if console is not None:
            assert re.search(console, "\n".join(node1)), (name, node1)
        # The training is the same whatever became of its telemetry.
        assert _losses(tmp_path / name) == reference, name
        if reason is None:
            continue
        text0 = "\n".join(node0)
        assert "missing ranks: 1 of 2 never reported" in node0, (name, text0)
        assert re.search(rf"^  missing r1 \(node 1\): {why}", text0, re.M), (name, text0)
        [missing] = summary["missing_ranks"]
        assert (missing["rank"], missing["node"], missing["reason"]) == (1, 1, reason), name
        assert re.match(why, missing["message"]), (name, missing)
