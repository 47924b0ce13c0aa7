"""Keep watching a remote job through an SSH tunnel: feed the view, rebuild the tunnel when it
drops, notice when the job is over.

The view gets its messages from a :class:`TunneledLiveSource` on the local end of the tunnel.
When ssh dies (network blip, laptop sleep, somebody killed it) the tunnel is reopened on the
same local ports; ZeroMQ reconnects by itself and the source's catch-up request ("everything
since seq N", zguide Clone) fills the gap, so no step is missing from the view.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from zeroscope.agent.schema import Message
from zeroscope.collector import protocol as proto
from zeroscope.remote.discovery import JobRecord
from zeroscope.remote.job_over import all_ranks_said_bye
from zeroscope.remote.ssh import SshClient, SshError, Tunnel
from zeroscope.state import ClusterState
from zeroscope.state.clock import receive_now
from zeroscope.state.lines import step_line, summary_lines
from zeroscope.store.gc_pause import catch_up_fold, is_catch_up
from zeroscope.store.sources import LiveSource

Status = Callable[[str], None]

QUIET_CHECK_S = 5.0
"""With no message for this long, ask the remote host whether the job still runs."""

BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)

NO_ANSWER_S = 5.0
"""A collector answers a snapshot request at once; silence this long through an open tunnel
usually means the SSH server refuses port forwarding (``AllowTcpForwarding no``)."""


class TunneledLiveSource(LiveSource):
    """A LiveSource whose collector sits behind ``ssh -L``.

    The collector announces its PUB endpoint as seen on *its* host (``tcp://127.0.0.1:P``);
    here that endpoint is the tunnel's local end instead, so the announcement is rewritten.
    (A ``pub_address`` argument on LiveSource would make this override unnecessary.)
    """

    def __init__(self, viewer_address: str, token: bytes, pub_address: str) -> None:
        self._local_pub = pub_address
        super().__init__(viewer_address, token)

    def _on_reply(self, frames: list[bytes], out: list[Message]) -> None:
        if len(frames) >= 5 and frames[0] == proto.END:
            frames = [*frames[:4], self._local_pub.encode(), *frames[5:]]
        super()._on_reply(frames, out)


def open_source(tunnel: Tunnel, job: JobRecord) -> TunneledLiveSource:
    """The live source on the local ends of ``tunnel``."""
    viewer = tunnel.local_address(job.viewer_port)
    # Without a PUB port in the record, live updates still come, by catch-up requests only
    # (every second); port 1 is never a collector.
    pub = tunnel.local_address(job.pub_port) if job.pub_port else "tcp://127.0.0.1:1"
    return TunneledLiveSource(viewer, job.token.encode(), pub)


class TunnelKeeper:
    """Rebuilds the tunnel when ssh exits and tells whether the job is still there.

    ``check()`` is cheap while the tunnel is up; call it often (the headless loop does, the
    TUI runs it on a thread). It returns False once the job is over (or unreachable for good).
    """

    def __init__(
        self,
        *,
        client: SshClient,
        job: JobRecord,
        tunnel: Tunnel,
        remote_zeroscope: str,
        status: Status,
        max_reconnects: int = 20,
    ) -> None:
        self.client = client
        self.job = job
        self.tunnel = tunnel
        self.remote_zeroscope = remote_zeroscope
        self.status = status
        self.max_reconnects = max_reconnects
        self.reconnects = 0
        self.finished = False
        self.last_message_s = time.monotonic()
        self._last_check_s = time.monotonic()
        self.source: LiveSource | None = None
        """Set by watch_job: lets the keeper notice a collector that never answers."""
        self._opened_s = time.monotonic()
        self._warned_silence = False

    def remote_state(self) -> str:
        """``running`` / ``finished`` / ``gone`` for our job, asked over SSH."""
        for j in self.client.remote_jobs(self.remote_zeroscope):
            if j.job_id == self.job.job_id and j.pid == self.job.pid:
                return j.state
        return "gone"

    def check(self) -> bool:
        if self.finished:
            return False
        now = time.monotonic()
        if self.tunnel.alive():
            self._warn_if_unanswered(now)
            quiet = now - max(self.last_message_s, self._last_check_s)
            if quiet > QUIET_CHECK_S:
                self._last_check_s = now
                try:
                    if self.remote_state() != "running":
                        return self._finish()
                except SshError:
                    pass  # the tunnel's own keep-alives will tell if the host is gone
            return True
        code = self.tunnel.proc.returncode if self.tunnel.proc else None
        self.status(f"tunnel dropped (ssh exit {code}); reconnecting")
        return self._reconnect()

    def _warn_if_unanswered(self, now: float) -> None:
        if self._warned_silence or self.source is None or self.source.instance is not None:
            return
        if now - self._opened_s > NO_ANSWER_S:
            self._warned_silence = True
            self.status(
                f"no answer from the collector through the tunnel after {NO_ANSWER_S:.0f} s; "
                f"does the SSH server on {self.client.target.host} allow TCP forwarding "
                "(AllowTcpForwarding)?"
            )

    def _finish(self) -> bool:
        self.finished = True
        self.status(f"job {self.job.job_id} is over")
        return False

    def _reconnect(self) -> bool:
        failures = 0
        while True:
            try:
                if self.remote_state() != "running":
                    return self._finish()
                self.tunnel.open()
                self.reconnects += 1
                self.status(f"tunnel restored (ssh pid {self.tunnel.pid})")
                self.last_message_s = time.monotonic()
                return True
            except SshError as exc:
                failures += 1
                if failures > self.max_reconnects or exc.failure in ("auth", "hostkey"):
                    raise
                delay = BACKOFF_S[min(failures - 1, len(BACKOFF_S) - 1)]
                self.status(f"{exc}; retrying in {delay:.1f} s")
                time.sleep(delay)


def watch_headless(source: LiveSource, keeper: TunnelKeeper, state: ClusterState) -> int:
    """One line per completed step; ends when every rank said Bye or the job is gone."""
    while True:
        snapshots = source.snapshots
        messages = source.poll(0.2)
        if messages:
            keeper.last_message_s = time.monotonic()
        now = receive_now()
        # A late viewer's snapshot: the collector held off, the state frozen after.
        with catch_up_fold(is_catch_up(len(messages)), freeze=source.snapshots != snapshots):
            for m in messages:
                for agg in state.ingest(m, now):
                    print(step_line(agg), flush=True)
        if all_ranks_said_bye(state) or not keeper.check():
            for m in source.poll(0.3):  # the last messages in flight
                for agg in state.ingest(m, now):
                    print(step_line(agg), flush=True)
            break
    for agg in state.flush():
        print(step_line(agg), flush=True)
    for line in summary_lines(state, keeper.job.trace):
        print(line, flush=True)
    return 0


class _Stamped:
    """The source as the TUI's worker polls it, telling the keeper when messages arrive (so it
    asks the remote host about the job only when things go quiet)."""

    def __init__(self, source: LiveSource, keeper: TunnelKeeper) -> None:
        self.source, self.keeper = source, keeper

    @property
    def snapshots(self) -> int:
        """The source's state snapshots taken (LiveFeed freezes the state folded from one)."""
        return self.source.snapshots

    def poll(self, timeout: float = 0.1) -> list[Message]:
        messages = self.source.poll(timeout)
        if messages:
            self.keeper.last_message_s = time.monotonic()
        return messages


def watch_tui(source: LiveSource, keeper: TunnelKeeper, state: ClusterState) -> int:
    """The Textual view; the keeper runs on a thread beside it and reports through the app's
    notifications (the terminal belongs to Textual)."""
    from zeroscope.tui.app import ZeroscopeApp
    from zeroscope.tui.feed import LiveFeed

    app = ZeroscopeApp(state, LiveFeed(_Stamped(source, keeper)), trace=keeper.job.trace)
    printed = keeper.status

    def notify(line: str) -> None:
        try:
            app.call_from_thread(app.notify, line, title="attach")
        except RuntimeError:  # the app is not running (yet, or any more)
            printed(line)

    keeper.status = notify
    # A passphrase prompt on reconnect would land in the middle of the TUI: fail instead (the
    # first connection, made before the TUI started, could prompt; ssh-agent keeps working).
    keeper.client.batch = True
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(0.5):
            try:
                if not keeper.check():
                    break
            except SshError as exc:
                notify(str(exc))
                return
        if keeper.finished:
            with contextlib.suppress(RuntimeError):  # the app already stopped
                app.call_from_thread(app.mark_over)

    thread = threading.Thread(target=keep, name="zeroscope-tunnel", daemon=True)
    thread.start()
    try:
        app.run()
    finally:
        stop.set()
        keeper.status = printed
    return 0


def watch_job(
    *,
    client: SshClient,
    job: JobRecord,
    tunnel: Tunnel,
    remote_zeroscope: str,
    headless: bool,
    max_reconnects: int,
    status: Status,
) -> int:
    """Run the view (TUI, or one line per step) on the tunnelled job until it ends."""
    keeper = TunnelKeeper(
        client=client,
        job=job,
        tunnel=tunnel,
        remote_zeroscope=remote_zeroscope,
        status=status,
        max_reconnects=max_reconnects,
    )
    source = open_source(tunnel, job)
    keeper.source = source
    state = ClusterState()
    state.job_id = job.job_id  # named even before (or if never) a rank reports
    try:
        if not headless:
            try:
                return watch_tui(source, keeper, state)
            except ImportError:
                status("the TUI is not available in this build; printing one line per step")
        return watch_headless(source, keeper, state)
    finally:
        source.close()
