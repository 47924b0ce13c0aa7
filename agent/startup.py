"""Starting a rank's live agent from the environment torchrun and ``zeroscope run`` set (the
process-level half of agent/live.py: which collector, who this rank is, which job, and the
hooks that say Bye when the process exits)."""

from __future__ import annotations

import atexit
import os
import socket
import sys
from typing import Any, NoReturn

from .api import COLLECTOR_ENV, NullTelemetry, Telemetry
from .exit_status import STATUS
from .live import LiveTelemetry
from .publish import TOKEN_ENV, Publisher
from .schema import SenderClaim
from .termination import TerminationBye

JOB_ID_ENV = "ZEROSCOPE_JOB_ID"
ENGINE_ENV = "ZEROSCOPE_ENGINE"
SPAWNED_ENV = "ZEROSCOPE_SPAWNED_BY"
"""Set (to the spawning process's pid) for the processes a job starts itself (``multiprocessing``'s
``Process.start``: ``torch.multiprocessing.spawn``, ``mp.Process``; agent/attach/spawned.py);
those that join a process group are ranks the job spawned, which inherit
the launcher's ``RANK``/``WORLD_SIZE`` of the process that spawned them (or whatever the
spawning code, accelerate's ``notebook_launcher``, set), so who they are is their process
group's."""


CONNECT_TIMEOUT_S = 5.0
"""At start-up only: how long a rank waits for its collector connection before going on (the
collector of ``zeroscope run`` is up before the ranks start, so this is milliseconds; on a
heavily loaded 2-core machine 2 s was once too short and step 1's report was lost)."""


def start_agent() -> Telemetry:
    """Build this rank's live agent from the environment torchrun and ``zeroscope run`` set;
    a NullTelemetry if anything goes wrong (telemetry must never stop a job)."""
    try:
        device_timing_environment()
        env = os.environ
        rank, world_size, local_rank, local_world_size, spawned = identity(env)
        node_rank = int(env.get("GROUP_RANK", "0"))
        # The handshake says who this is, so a collector that refuses it can still name it.
        claim = SenderClaim(
            rank=rank, world_size=world_size, node_rank=node_rank, hostname=socket.gethostname()
        )
        publisher = Publisher(env[COLLECTOR_ENV], env.get(TOKEN_ENV, "").encode(), claim=claim)
        publisher.wait_connected(CONNECT_TIMEOUT_S)
        agent = LiveTelemetry(
            publisher,
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            node_rank=node_rank,
            local_world_size=local_world_size,
            spawned=spawned,
            job_id=env.get(JOB_ID_ENV)
            or f"{socket.gethostname()}-{env.get('MASTER_PORT', os.getppid())}",
            engine=env.get(ENGINE_ENV, "zeroscope"),
        )
        install_exit_hooks(agent)
        return agent
    except Exception as exc:
        print(f"zeroscope: telemetry disabled ({exc!r})", file=sys.stderr)
        return NullTelemetry()


def identity(env: Any) -> tuple[int, int, int, int, bool]:
    """(rank, world size, local rank, local world size (0: unknown), spawned) of this process:
    the launcher's variables, or, in a rank the job spawned itself (:data:`SPAWNED_ENV`), its
    default process group's, as the launcher's say who spawned it. Spawned on a one-node job,
    the ranks are that node's; on more nodes, which of them share one is not known."""
    rank = int(env.get("RANK", "0"))
    world = int(env.get("WORLD_SIZE", "1"))
    local = (int(env.get("LOCAL_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", "0")))
    spawner = env.get(SPAWNED_ENV)
    dist = sys.modules.get("torch.distributed")
    if spawner and spawner != str(os.getpid()) and dist is not None:
        try:
            if dist.is_initialized():
                rank, world = int(dist.get_rank()), int(dist.get_world_size())
                local = (rank, world) if env.get("GROUP_WORLD_SIZE", "1") == "1" else (0, 0)
                return rank, world, *local, True
        except Exception:
            pass
    return rank, world, *local, False


def device_timing_environment() -> None:
    """On a GPU host: torch's Flight Recorder and NCCL's per-collective timing, where the agent
    reads each collective's device duration (agent/device_collective.py). Effective for process
    groups created from now on, so an agent-API job that asks for its telemetry first gets
    them (under ``zeroscope run`` the bootstrap has set them already)."""
    try:
        import torch

        if torch.cuda.is_available():
            from .attach.flight_recorder import configure_environment

            configure_environment()
    except Exception:
        pass  # no device durations (NA), said by their clock


def install_exit_hooks(agent: LiveTelemetry) -> None:
    """Bye at interpreter exit (with the status ``sys.exit`` was given: agent/exit_status.py);
    an uncaught exception sends an ``error`` Event and a Bye with exit code 1, then the
    previous excepthook prints the user's traceback as usual; SIGTERM (a launcher stopping the
    job) sends a Bye before the process dies of it (agent/termination.py)."""
    previous = sys.excepthook

    def excepthook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
        try:
            if not agent.closed:
                text = f"{tp.__name__}: {value}".splitlines()[0][:500]
                agent.event("error", text)
                agent.close(1, text)
        except Exception:
            pass
        previous(tp, value, tb)

    sys.excepthook = excepthook
    status = STATUS
    status.install()  # (the attach did at start-up, before the script took the name)
    status.count_steps(lambda: agent.step)

    def bye_at_exit() -> None:
        code, reason = status.at_exit()  # sys.exit(n): its status, not 0
        if reason and not agent.closed:
            agent.event("error", reason)
        agent.close(code, reason)

    atexit.register(bye_at_exit)
    _bye_before_os_exit(agent)
    agent.termination = TerminationBye(
        lambda code, message: agent.close(code, message, hurry=True), saying=agent.saying_bye
    )
    agent.termination.install()


def _bye_before_os_exit(agent: LiveTelemetry) -> None:
    """``os._exit(n)`` skips the exit hooks: a job that ends so (to dodge a hang in a process
    group's teardown) lost its last reports, up to half a second of steps, and its Bye (the
    trace then said the rank died after step 1 of 5). The reports held and a Bye with ``n``
    go first, in a hurry (as for SIGTERM), then the real ``os._exit(n)``. Only in this process:
    a forked child (a DataLoader worker ends by ``os._exit``) exits as it would."""
    real = os._exit
    pid = os.getpid()

    def _exit(status: int) -> NoReturn:
        if os.getpid() == pid and not agent.closed:
            try:
                agent.close(int(status), hurry=True)
            except Exception:
                pass
        real(status)

    os._exit = _exit
