"""ClusterState: every rank's messages folded into one model of the job. Pure Python, no Textual.

The TUI, the headless lines, replay and the tests all read this one model. Views align ranks by
*step*, never by wall clock (ranks' clocks may disagree); the only clock is the receive time
the caller passes to :meth:`ClusterState.ingest` (live: zeroscope.state.clock's, wall seconds that
are never stepped; replay and tests: the message's own ``wall_ns``), used for "rank silent" alerts.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable

from zeroscope.agent.schema import (
    Admission,
    Bye,
    ConfigSummary,
    Event,
    Heartbeat,
    Hello,
    Message,
    ParamCounts,
    StepReport,
)

from .alerts import Alert, AlertRules, evaluate
from .conditions import RankConditions
from .ending import JobEnd
from .history import StepSeries, step_point
from .mesh import mesh_shape
from .nodes import NodeBook
from .rank import HISTORY_STEPS, RankState, steps_kept
from .roster import MissingGroup, Roster, missing_of
from .sequences import SequenceBook
from .step import StepAggregate
from .stragglers import Finding, LagBook, judge, judge_by_stage
from .totals import ClusterTotals

SCALE_EVENTS = ("overflow", "scale_change", "scale_at_minimum", "nan_loss")
"""The events of the loss-scale screen's list."""


class ClusterState:
    """Per-rank latest + history, per-step aggregates, events, alerts."""

    def __init__(
        self, *, history_steps: int = HISTORY_STEPS, rules: AlertRules | None = None
    ) -> None:
        self.rules = rules or AlertRules()
        self.history_steps = history_steps
        self.kept_steps = history_steps
        """Steps of summaries kept (``steps``, each rank's ``history``): ``history_steps``,
        fewer for a job of thousands of ranks (rank.steps_kept); the series keeps
        ``history_steps`` points."""
        self.ranks: dict[int, RankState] = {}
        self.steps: OrderedDict[int, StepAggregate] = OrderedDict()
        self.events: deque[Event] = deque(maxlen=2000)
        self.job_id = ""
        self.thinned = ""
        """Read from a thinned trace: the sentence that says what was kept (store/thinning.py),
        shown beside every run figure; "" when every step was kept."""
        self.job_end: JobEnd | None = None
        """How the launcher saw the job end, read from a trace ``zeroscope run`` recorded
        (zeroscope.state.ending); None live and for other traces."""
        self.world_size = 0
        self.config: ConfigSummary | None = None
        self.params: ParamCounts | None = None
        self.device = ""
        self.engine = ""
        """What the ranks run on (Hello.engine): ``zeroscope`` (the bundled engine), or the
        engine the attach found (``deepspeed``, ``fsdp2``, ``ddp``, ``hf-trainer+...``)."""
        self.clock_s = 0.0
        self.messages = 0
        self.version = 0
        """Bumped on every change: a view redraws only when it moved."""
        self.last_complete: int | None = None
        self.recording_error = ""
        """Set by the collector's owner when the trace stopped recording (an alert)."""
        self.steps_completed = 0
        """Steps closed since the start (``steps`` keeps only the last ``history_steps``)."""
        self.totals = ClusterTotals()
        """The whole run's cluster figures (steps/s, samples/s, mean step, exposed %)."""
        self.lags = LagBook(self.rules)
        """Stragglers and slow links (zeroscope.state.stragglers)."""
        self.roster = Roster()
        """The collector's Admission records: who was turned away (state/roster.py)."""
        self.sequences = SequenceBook()
        """Steps whose ranks issued different collective sequences (state/sequences.py)."""
        self.series = StepSeries(history_steps)
        """The cluster's figures per closed step, for the history plots (state/history.py)."""
        self.staged = False
        """Some rank runs a pipeline stage or a tensor slice (Hello.parallel): ranks are then
        compared (stragglers, collective sequences) with their own stage's replicas only."""
        self.throughput_na_said: set[str] = set()
        """Why a step line's tokens/s, FLOP/s or MFU read NA: each reason is said once under
        its first step line (zeroscope.state.lines.step_lines)."""
        self.nodes = NodeBook()
        """Ranks by node and each node's figures, for the node table (state/nodes.py)."""
        self.conditions = RankConditions(self.rules.headroom_min, self.rules.host_available_min)
        """The alerts' per-rank conditions, kept as messages arrive (state/conditions.py)."""
        self.hellos_version = 0
        """Bumped on every Hello: what is read from all the Hellos is cached until it moves."""
        self._mesh: tuple[int, str | None] | None = None
        self._none_missing: tuple[int, int] | None = None
        self._config_rank: int | None = None
        """The rank whose Hello gave ``config`` and ``params``."""

    # ----------------------------------------------------------------- ingest
    def rank(self, rank: int) -> RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState(rank, history=deque(maxlen=self.kept_steps))
            self.nodes.touch(rank)
        return state

    def ingest(self, message: Message, received_s: float | None = None) -> list[StepAggregate]:
        """Fold one message in; returns the steps it completed (oldest first)."""
        return self.ingest_all([message], received_s)

    def ingest_all(
        self, messages: Iterable[Message], received_s: float | None = None
    ) -> list[StepAggregate]:
        """Fold messages in, in order; returns the steps they completed (oldest first).
        ``received_s``: when they arrived (live: the receiver's clock); None in replay, where
        each arrives at its own ``wall_ns``, never before the newest instant seen so far (a
        rank whose clock runs an hour behind is not silent for an hour).

        One loop for a whole batch, with a step's reports written out in it: a viewer folds
        every rank's report of every step (16,384 a step at the largest jobs), where each call
        and lookup per report is ~1 ms of the step (bench/view_ingest.py)."""
        done: list[StepAggregate] = []
        ranks, steps, nodes, conditions = self.ranks, self.steps, self.nodes, self.conditions
        # The step of the report before this one: steps are added here, and the one evicted
        # to make room is never the one just added.
        agg: StepAggregate | None = None
        for m in messages:
            if isinstance(m, Admission):
                # The collector's record, not a rank's: it names no reporting rank and moves
                # no clock (replay reads these before the steps, with the Hellos).
                self.messages += 1
                self.version += 1
                wall = m.wall_ns / 1e9 if received_s is None else received_s
                self.roster.note(m, wall)
                continue
            if received_s is None:
                wall = (m.started_ns if isinstance(m, Hello) else m.wall_ns) / 1e9
                now = wall if wall > self.clock_s else self.clock_s
            else:
                now = received_s
            if now > self.clock_s:
                self.clock_s = now
            self.messages += 1
            self.version += 1
            r = m.rank
            rank = ranks.get(r) or self.rank(r)
            before = rank.last_seen_s
            seen = before or 0.0
            seen = now if now > seen else seen
            if seen != before:
                rank.last_seen_s = seen
                if rank.bye is None:
                    conditions.seen(r, seen)
            if not isinstance(m, StepReport):
                self._other(rank, m, now)
                agg = None  # a Hello of a larger world may have let older steps go (_keep)
                continue
            step = m.step
            if self.last_complete is not None and step <= self.last_complete:
                rank.record(m)  # a late report of a step already closed: history only
                self._conditions_of(rank, m)
                continue
            if agg is None or agg.step != step:
                agg = steps.get(step)
                if agg is None:
                    agg = steps[step] = StepAggregate(step)
                    while len(steps) > self.kept_steps:
                        steps.popitem(last=False)
            summaries = agg.summaries
            summaries[r] = rank.record(m)
            if m.dropped or m.host is not None:
                self._conditions_of(rank, m)
            nodes.touch(r)
            agg._median = None
            agg.samples += m.samples
            agg.skipped = agg.skipped or m.skipped
            if len(summaries) >= (self.world_size or len(ranks)):
                done += self._close_until(step)
            elif len(summaries) >= len(ranks):
                # Every rank this collector hears from (one node's share of a multi-node job
                # has fewer than world_size) is two steps past the older ones: close those.
                # Two, not one, so a rank whose first messages are merely late in transit is
                # waited for.
                done += self._close_until(step - 2)
        return done

    def _other(self, rank: RankState, message: Message, received_s: float) -> None:
        """A rank's message other than a step report."""
        if isinstance(message, Hello):
            rank.hello = message
            self.hellos_version += 1
            layout = message.parallel
            if layout is not None and (layout.pp_size > 1 or layout.tp_size > 1):
                self.staged = True
            self.nodes.place(message.rank, message)
            self.roster.start(received_s)
            self.job_id = self.job_id or message.job_id
            self.world_size = max(self.world_size, message.world_size)
            kept = steps_kept(self.world_size, self.history_steps)
            if kept < self.kept_steps:
                self._keep(kept)
            if self.config is None or message.rank == self._config_rank:
                # The first rank's, and its own again when it says more (a Hello sent again)
                self.config, self.params = message.config, message.params
                self._config_rank = message.rank
            self.device = self.device or message.device
            self.engine = message.engine or self.engine
        elif isinstance(message, Event):
            self.events.append(message)
        elif isinstance(message, Heartbeat):
            if message.dropped:
                rank.dropped += message.dropped
                self.conditions.dropped(message.rank, rank.dropped)
            if message.host is not None:
                rank.host = message.host
                self.conditions.host(message.rank, message.host)
        elif isinstance(message, Bye):
            rank.bye = message
            self.conditions.bye(message.rank, message)

    def _keep(self, kept: int) -> None:
        """Keep ``kept`` steps of summaries from now on (a Hello said a larger world)."""
        self.kept_steps = kept
        for rs in self.ranks.values():
            rs.history = deque(rs.history, maxlen=kept)
        while len(self.steps) > kept:
            self.steps.popitem(last=False)

    def _conditions_of(self, rank: RankState, report: StepReport) -> None:
        """The report's host sample (if it became the rank's newest) and drop count, to the
        alerts' conditions."""
        if report.host is not None and rank.host is report.host:
            self.conditions.host(report.rank, report.host)
        if report.dropped:
            self.conditions.dropped(report.rank, rank.dropped)

    def _close_until(self, step: int) -> list[StepAggregate]:
        """Close ``step`` and every older open step (their missing reports were dropped)."""
        closed = []
        for s, agg in self.steps.items():
            if s > step:
                break
            if not agg.complete:
                agg.close()
                self.steps_completed += 1
                self._judge(agg)
                closed.append(agg)
                self.last_complete = s
        return closed

    def flush(self) -> list[StepAggregate]:
        """The job ended: close the steps still waiting for reports that will never come."""
        return self._close_until(max(self.steps)) if self.steps else []

    def _judge(self, agg: StepAggregate) -> None:
        """A step closed: rank standings (stragglers, slow links) and the run's totals."""
        agg.standings = (
            judge_by_stage(agg.summaries, self.ranks) if self.staged else judge(agg.summaries)
        )
        # One report of a several-rank job's step has no peer either (DDP's Join, drops).
        agg.unpeered = not agg.standings and (self.staged or len(agg.summaries) < len(self.ranks))
        self.sequences.add(agg, self.ranks, self.staged)
        for r, st in agg.standings.items():
            rs = self.ranks[r]
            if rs.summary is not None and rs.summary.step == agg.step:
                rs.slowness = st.slowness
        self.nodes.touch_all()
        self.lags.add(agg.step, agg.standings, agg.median_time)
        flagged = next((f for f in self.lags.findings() if f.kind == "straggler"), None)
        self.series.add(
            step_point(agg, flagged.rank if flagged else None),
            flagged.first_step if flagged else None,
        )
        self.totals.add(
            step=agg.step,
            wall_ns=agg.wall_ns,
            step_time=agg.step_time,
            exposed=agg.exposed_s,
            samples=agg.samples,
            skipped=agg.skipped,
            overflow=agg.overflow,
            exposed_unmeasured=agg.exposed_unmeasured,
            grad_norm=agg.grad_norm,
        )

    # ------------------------------------------------------------------ views
    # The API views, summary, export and later screens (history plots, the advisor) read:
    # per step: ``steps`` / ``complete_steps()`` / ``latest()`` (StepAggregate); per rank:
    # ``ranks[r]`` (RankState: summary, history, totals, host); the run: ``totals``
    # (ClusterTotals); ``throughput()``, ``findings()``, ``alerts()``; per-step series in
    # zeroscope.state.history; predictions in zeroscope.state.prediction; all of it as one
    # dict in zeroscope.state.report.

    def scale_events(self, limit: int = 200) -> list[Event]:
        """The newest ``limit`` loss-scale events (overflow, scale change, scale at minimum, nan
        loss), newest step first, ranks in order within a step. They arrive in the order the
        ranks' reports do, which interleaves ranks and steps: a list titled "newest first" in
        arrival order was not in step order."""
        found = [e for e in self.events if e.event in SCALE_EVENTS]
        found.sort(key=lambda e: (-e.step, e.rank))
        return found[:limit]

    def latest(self) -> StepAggregate | None:
        """The newest complete step (or the newest step at all before any completed)."""
        if self.last_complete is not None and self.last_complete in self.steps:
            return self.steps[self.last_complete]
        return next(reversed(self.steps.values()), None)

    def complete_steps(self) -> list[StepAggregate]:
        """Closed steps kept in history, oldest first."""
        return [a for a in self.steps.values() if a.complete]

    def throughput(self, window: int = 10) -> tuple[float | None, float | None]:
        """(steps/s, samples/s) over the last ``window`` complete steps, from the ranks' own
        step-end instants: (n - 1) steps / the span from the first's end to the last's end;
        samples are those of the n - 1 steps after the first. NA until two steps completed.
        The whole run's figures are ``totals.steps_per_s`` / ``totals.samples_per_s``."""
        done = self.complete_steps()[-window - 1 :]
        if len(done) < 2:
            return None, None
        span = (done[-1].wall_ns - done[0].wall_ns) / 1e9
        if span <= 0:
            return None, None
        samples = sum(a.samples for a in done[1:])
        return (len(done) - 1) / span, (samples / span if samples else None)

    def slowness(self, rank: int) -> float | None:
        """This rank's compute time in its newest complete step relative to the median of
        the other ranks' (1.00 = typical); NA until judged."""
        state = self.ranks.get(rank)
        return state.slowness if state is not None else None

    def findings(self) -> list[Finding]:
        """Ranks flagged now as stragglers or slow links, largest excess first."""
        return self.lags.findings()

    def missing(self) -> list[MissingGroup]:
        """Ranks of the job that never reported, grouped by node and reason (state/roster.py).
        Once every rank of a known world reported, the answer stays "none" until the world size
        or the ranks change (ranks are never forgotten, so their count says when): the alerts
        ask every frame, and the check reads ``range(world)``, 16,384 lookups."""
        key = (self.world_size, len(self.ranks))
        if self.world_size and self._none_missing == key:
            return []
        groups = missing_of(self)
        self._none_missing = key if not groups else None
        return groups

    def mesh_shape(self) -> str | None:
        """The job's mesh, ``pp2×dp2×tp2 ...`` (state/mesh.py ``mesh_shape`` over every rank's
        Hello, in rank-arrival order), worked out again only when a Hello arrived: the header
        asks every frame, and a data-parallel job's Hellos hold no layout to end the search."""
        if self._mesh is None or self._mesh[0] != self.hellos_version:
            self._mesh = (self.hellos_version, mesh_shape(rs.hello for rs in self.ranks.values()))
        return self._mesh[1]

    def alerts(self, now_s: float | None = None) -> list[Alert]:
        return evaluate(self, self.clock_s if now_s is None else now_s)
