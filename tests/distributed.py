"""Run a function on N torch.distributed ranks (gloo, CPU) and fail fast with the failing
rank's traceback — never a hang.

Ranks are real processes started from a forkserver that has torch preloaded (fast, and safe:
the server never ran an OpenMP region, so forked children cannot inherit a dead thread pool).
Each rank sees the same environment torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), so engine code under test initializes exactly as under torchrun.

Ranks that only run real DeepSpeed may come from a second forkserver that has DeepSpeed (and
what it drags in: torch's Dynamo and inductor, transformers) preloaded as well
(``preload=DEEPSPEED``, tests/deepspeed_ranks.py): those imports are most of a DeepSpeed rank's
start-up, ~8 s of CPU each. The first server must not preload them: the agent takes another path
once ``torch._dynamo`` is imported (agent/activations.py), so the bundled engine's ranks would no
longer run the path a job without Dynamo takes.

Ranks see no GPU (``CUDA_VISIBLE_DEVICES=""``) unless the call opts in with ``gpu=True``: the
engine picks CUDA whenever it is available and ``LOCAL_RANK`` is set, so on a machine with a GPU
the CPU tiers would otherwise run on NCCL (and two ranks on one GPU).
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import queue
import random
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import forkserver, popen_forkserver
from pathlib import Path
from typing import Any

_CTX = mp.get_context("forkserver")
_BASE = ("torch", "torch.distributed")
_CTX.set_forkserver_preload(list(_BASE))

DEEPSPEED = ("tests.deepspeed_ranks",)
"""``run_ranks(..., preload=DEEPSPEED)``: ranks forked from a server that imported real DeepSpeed
(only for ranks that import it anyway: never the bundled engine's)."""

_SERVERS: dict[tuple[str, ...], forkserver.ForkServer] = {}


@contextmanager
def _server_environment() -> Iterator[None]:
    """The environment a preloading server starts in: what every rank it forks sets anyway
    before DeepSpeed looks (its accelerator is chosen, and its ops probed, at the server's
    import), and one OpenMP thread, so nothing the imports run leaves a thread pool that the
    forked ranks would inherit dead."""
    pinned = {"CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    saved = {key: os.environ.get(key) for key in pinned}
    os.environ.update(pinned)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _server(preload: tuple[str, ...]) -> forkserver.ForkServer:
    server = _SERVERS.get(preload)
    if server is None:
        server = _SERVERS[preload] = forkserver.ForkServer()
        server.set_forkserver_preload([*_BASE, *preload])
    with _server_environment():
        server.ensure_running()  # started once; restarted if it died
    return server


class _PreloadedPopen(popen_forkserver.Popen):
    """Starts a rank from a preloading server: the standard forkserver Popen, whose launch asks
    the module's one server for a new process, pointed at ours for that one call."""

    def _launch(self, process_obj: Any) -> None:
        connect = forkserver.connect_to_new_process
        forkserver.connect_to_new_process = _server(process_obj.preload).connect_to_new_process
        try:
            super()._launch(process_obj)
        finally:
            forkserver.connect_to_new_process = connect


class _PreloadedProcess(_CTX.Process):  # type: ignore[name-defined,misc]
    preload: tuple[str, ...] = ()

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _PreloadedPopen(process_obj)


class RankFailed(AssertionError):
    """A rank raised or died; the message carries its rank and traceback."""


_PICK = random.SystemRandom()  # not the global generator: tests seed that one


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1, drawn below the kernel's ephemeral
    range. A port the kernel hands out for ``bind(0)`` comes from that range, which every
    outgoing connection on the machine also draws its local port from (the suite's TCPStore
    clients, ZeroMQ sockets, ssh): between this check and the job's own bind, a busy suite's
    connection could take it, and a rank that dials a port its own connection holds can wait
    on it for the store's whole timeout (a fresh-check saw rank 1 wait 115 s in
    ``init_process_group``). Below the range only another listener can take it."""
    low, _ = _ephemeral_range()
    if low < 3072:  # no room below a range that starts this low: the kernel's choice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for _ in range(200):
        port = _PICK.randrange(max(1024, low - 12_000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port below {low} after 200 tries")


def _ephemeral_range() -> tuple[int, int]:
    """Linux's ephemeral port range (its default where the file cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def connected_publisher(address: str) -> Any:
    """A Publisher to ``address`` that finished its TCP handshake, as ``start_agent`` makes
    one: the agent sends a report as its step ends, and a socket still connecting drops it."""
    from zeroscope.agent.publish import Publisher

    publisher = Publisher(address)
    if not publisher.wait_connected(10.0):
        raise AssertionError(f"no connection to the collector at {address} in 10 s")
    return publisher


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world: int,
    port: int,
    args: tuple,
    results: Any,
    visible: str | None,
    timeout: float = 120.0,
) -> None:
    # Before anything asks CUDA: the forkserver preloaded torch without initializing it.
    if visible is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    # A rank still running shortly before run_ranks gives up prints where each of its threads
    # is (to its stderr): a hang names its place in the log instead of only its rank.
    with contextlib.suppress(Exception):
        faulthandler.dump_traceback_later(max(timeout - 5.0, 1.0), exit=False)
    try:
        value = fn(rank, world, *args)
        results.put((rank, "ok", value))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        faulthandler.cancel_dump_traceback_later()


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    gpu: bool = False,
    preload: tuple[str, ...] = (),
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` processes; return each rank's
    result in rank order. ``fn`` must be a module-level function (it travels by reference).
    The ranks see CUDA only with ``gpu=True`` (then as this process sees it). ``preload``
    (``DEEPSPEED``): modules their server imported before forking them (CPU ranks only).

    The first rank that raises fails the call at once with its traceback (the others are
    killed); a rank that dies without a word, or a run past ``timeout`` seconds, fails too.
    """
    port = free_port()
    results = _CTX.Queue()
    # A GPU test is not hidden by conftest, so this process's own setting is the machine's.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if gpu else ""
    if preload and gpu:
        raise ValueError("a preloading server hides CUDA: preload is for CPU ranks")
    process = _PreloadedProcess if preload else _CTX.Process
    procs = []
    for r in range(world_size):
        p = process(
            target=_entry,
            args=(fn, r, world_size, port, args, results, visible, timeout),
            daemon=True,
        )
        if preload:
            p.preload = preload
        procs.append(p)
    for p in procs:
        p.start()
    done: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(done) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world_size)) - set(done))
                raise RankFailed(f"ranks {missing} did not finish within {timeout:.0f} s")
            try:
                rank, status, value = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in done and p.exitcode is not None:
                        # Give its final message a moment to arrive before calling it silent.
                        try:
                            rank, status, value = results.get(timeout=2.0)
                            break
                        except queue.Empty:
                            raise RankFailed(
                                f"rank {r} exited with code {p.exitcode} without a result"
                            ) from None
                else:
                    continue
            if status == "error":
                raise RankFailed(f"rank {rank} of {world_size} failed:\n{value}")
            done[rank] = value
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=5)
    return [done[r] for r in range(world_size)]


_SINK: str | None = None


def sink_collector() -> str:
    """The address of a collector that admits every agent and reads nothing back: the ranks of
    a test that checks what the agent measured in-process (not what a collector got) connect at
    once, where an address nobody listens on holds each agent's start-up for its whole connect
    wait (agent/startup.py's ``CONNECT_TIMEOUT_S``, 5 s a rank). One per test process: a ZeroMQ
    PULL whose handshakes a ZAP handler admits (as the collector's gate does for a job without a
    token), drained and discarded by a daemon thread."""
    global _SINK
    if _SINK is None:
        import threading

        import zmq

        ctx = zmq.Context()
        zap = ctx.socket(zmq.ROUTER)  # the ZAP handler: bound before the socket it answers for
        zap.setsockopt(zmq.LINGER, 0)
        zap.bind("inproc://zeromq.zap.01")
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        pull.plain_server = True
        pull.zap_domain = b"zeroscope-test-sink"
        port = pull.bind_to_random_port("tcp://127.0.0.1")

        def serve() -> None:
            poller = zmq.Poller()
            poller.register(zap, zmq.POLLIN)
            poller.register(pull, zmq.POLLIN)
            while True:
                for sock, _ in poller.poll():
                    frames = sock.recv_multipart()
                    if sock is zap:  # [id, "", version, request id, ...]: admit
                        zap.send_multipart([*frames[:4], b"200", b"OK", b"", b""])

        threading.Thread(target=serve, name="sink-collector", daemon=True).start()
        _SINK = f"tcp://127.0.0.1:{port}"
    return _SINK
